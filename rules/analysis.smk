rule attention:
    """Answer-position attention (visual, verb vs object, key area) of one model on a sample of every set.

    One job per (condition, model): the model loads once for all sets. Reads questions, images and boxes,
    never predictions: it can be added to a finished run.
    """
    input:
        questions=attention_questions,
        images=CONDITION_DIR,
        boxes=HICO_DET_BOXES,
        model_files=attention_model_files,
    output:
        ATTENTION_PART,
    wildcard_constraints:
        dataset="hico",
        model=_alternatives(ATTENTION_MODELS),
    params:
        model=lambda wildcards: ATTENTION_MODELS[wildcards.model],
        settings=ATTENTION_SETTINGS,
        det_root=lambda wildcards: HICO_DET_ROOT,  # the folder (its file may come from a download)
        identity=identity("hico_boxes"),
    resources:
        gpu=attention_resource("gpu", 0),
        mem_mb=attention_resource("mem_mb", 4000),
        runtime=attention_resource("runtime", 60),
        cpus_per_gpu=attention_resource("cpus_per_gpu", 4),
    log:
        in_logs("attention/{dataset}/{condition}/{model}.log"),
    benchmark:
        in_benchmarks("attention/{dataset}/{condition}/{model}.tsv")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/attention.py"


rule attention_figures:
    """The attention table, its correct-vs-hallucinated summary and the paper's Figs. 7, 8, 13, 14 drawn from it."""
    input:
        parts=attention_parts(),
    output:
        table=ATTENTION_TABLE,
        summary=ATTENTION_SUMMARY[0],
        summary_html=report(ATTENTION_SUMMARY[1], category="Attention", caption="../report/attention_summary.rst"),
        figures=[
            report(path, category="Attention", caption=f"../report/attention_fig{n}.rst")
            for n, path in ATTENTION_FIGURES.items()
        ],
        figure_prints=figure_prints(*ATTENTION_FIGURES.values()),  # the same figures as PDF and SVG
    params:
        qsets=ATTENTION_QSETS,  # the table's rows set by set, in this order
        models=ATTENTION_MODELS,
        roles=attention_figure_roles(),
        figures=ATTENTION_FIGURES,
        condition=lambda wildcards: ATTENTION_CONDITIONS[0] if ATTENTION_CONDITIONS else "clean",
        bootstrap=config["metrics"],
    log:
        in_logs("attention_figures.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/attention_figures.py"


rule vcd_divergence:
    """VCD divergence (docs/analysis.md, "VCD divergence"): the share of questions with KL exactly 0, the KL distribution and the
    decisions VCD flips against the plain counterpart, from the VCD runs' stored vcd_kl and vcd_plausible.
    Reads prediction tables only (no inference); planned only when a model runs a VCD variant."""
    input:
        questions=sorted({run["questions"] for run in VCD_DIVERGENCE_RUNS}),
        predictions=vcd_divergence_predictions(),
    output:
        table=VCD_DIVERGENCE_TABLE,
        html=report(VCD_DIVERGENCE_HTML, category="VCD divergence", caption="../report/vcd_divergence_table.rst"),
        hist=VCD_KL_HIST,
        figure=report(VCD_DIVERGENCE_FIGURE, category="VCD divergence", caption="../report/vcd_divergence.rst"),
        figure_prints=figure_prints(VCD_DIVERGENCE_FIGURE),  # the same figure as PDF and SVG
    params:
        runs=VCD_DIVERGENCE_RUNS,
        bins=VCD_DIVERGENCE_SETTINGS.bins,
        paper_names=TABLE_PAPER_NAMES,
        notes=vcd_divergence_notes(),
    log:
        in_logs("vcd_divergence.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/vcd_divergence.py"
