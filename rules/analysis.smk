rule attention:
    """Answer-position attention (visual, verb vs object, key area) of one model on a sample of every set.

    One job per (condition, model): the model loads once for all sets. Reads questions, images and boxes,
    never predictions: it can be added to a finished run.
    """
    input:
        questions=lambda wildcards: PLAN.questions(wildcards.dataset, PLAN.attention.qsets),
        images=PATHS.condition_images,
        boxes=PLAN.data.hico_det_boxes,
        model_files=get_attention_model_files,
    output:
        PATHS.attention_part,
    wildcard_constraints:
        dataset="hico",
        model=alternatives(PLAN.attention.models),
    params:
        model=lambda wildcards: PLAN.attention.models[wildcards.model],
        settings=PLAN.attention.settings,
        det_root=lambda wildcards: PLAN.data.hico_det_root,  # the folder (its file may come from a download)
        identity=identity("hico_boxes"),
    resources:
        gpu=attention_resource("gpu", 0),
        mem_mb=attention_resource("mem_mb", 4000),
        runtime=attention_resource("runtime", 60),
        cpus_per_gpu=attention_resource("cpus_per_gpu", 4),
    log:
        PATHS.log("attention"),
    benchmark:
        PATHS.benchmark("attention")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/attention.py"


rule attention_figures:
    """The attention table, its correct-vs-hallucinated summary and the paper's Figs. 7, 8, 13, 14 drawn from it."""
    input:
        parts=PLAN.attention.parts,
    output:
        table=PATHS.analysis("attention.parquet"),
        summary=PLAN.attention.summary[0],
        summary_html=reported(PLAN.attention.summary[1]),
        figures=[reported(path) for path in PLAN.attention.figures.values()],
        figure_prints=figure_prints(*PLAN.attention.figures.values()),  # the same figures as PDF and SVG
    params:
        qsets=PLAN.attention.qsets,  # the table's rows set by set, in this order
        models=PLAN.attention.models,
        roles=PLAN.attention.figure_roles,
        figures=PLAN.attention.figures,
        condition=PLAN.attention.figure_condition,
        bootstrap=config["metrics"],
    log:
        PATHS.log("attention_figures"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/attention_figures.py"


rule vcd_divergence:
    """VCD divergence (docs/analysis.md, "VCD divergence"): the share of questions with KL exactly 0, the KL distribution and the
    decisions VCD flips against the plain counterpart, from the VCD runs' stored vcd_kl and vcd_plausible.
    Reads prediction tables only (no inference); planned only when a model runs a VCD variant."""
    input:
        questions=PLAN.vcd_divergence.questions,
        predictions=PLAN.vcd_divergence.predictions,
    output:
        table=PLAN.vcd_divergence.files["table"],
        html=reported(PLAN.vcd_divergence.files["html"]),
        hist=PLAN.vcd_divergence.files["hist"],
        figure=reported(PLAN.vcd_divergence.files["figure"]),
        figure_prints=figure_prints(PLAN.vcd_divergence.files["figure"]),  # the same figure as PDF and SVG
    params:
        runs=PLAN.vcd_divergence.runs,
        bins=PLAN.vcd_divergence.settings.bins,
        paper_names=PLAN.paper_names,
        notes=PLAN.vcd_divergence.notes,
    log:
        PATHS.log("vcd_divergence"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/vcd_divergence.py"
