rule uncertainty:
    """Token uncertainty (Figs. 9, 12): histograms of the answer token's probability, correct vs hallucinated,
    and their metric rows (a part of the metrics table). Reads prediction tables only: no inference."""
    input:
        questions=sorted({run["questions"] for run in uncertainty_runs()}),
        predictions=[run["predictions"] for run in uncertainty_runs()],
    output:
        hist=UNCERTAINTY_HIST,
        metrics=UNCERTAINTY_METRIC_PART,
    params:
        runs=uncertainty_runs(),
        settings=UNCERTAINTY,
        bootstrap=config["metrics"],
    log:
        in_logs("uncertainty.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/uncertainty.py"


rule uncertainty_figures:
    """Figs. 9 (llava role) and 12 (instructblip role), drawn from the histogram table."""
    input:
        UNCERTAINTY_HIST,
    output:
        [
            report(path, category="Uncertainty", caption=f"../report/uncertainty_fig{n}.rst")
            for n, path in UNCERTAINTY_FIGURES.items()
        ],
        prints=figure_prints(*UNCERTAINTY_FIGURES.values()),  # the same figures as PDF and SVG
    params:
        figures=UNCERTAINTY_FIGURES,
        models=UNCERTAINTY_MODELS,
        skipped=[m for m in (UNCERTAINTY.models or MODELS) if m in NO_TOKEN_MODELS] if UNCERTAINTY else [],
        backends=model_backends(),
        notes=random_weight_notes(),
        variant=VARIANTS[0],
        condition=UNCERTAINTY.conditions[0] if UNCERTAINTY else "clean",
    log:
        in_logs("uncertainty_figures.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/uncertainty_figures.py"


rule fov:
    """Field of view (Fig. 10): accuracy and token uncertainty on the same single-instance questions,
    full image vs each crop, with paired image-bootstrap intervals. Reads prediction tables only."""
    input:
        tags=IMAGE_TAGS,
        questions=sorted({run["questions"] for run in fov_runs()}),
        predictions=[path for run in fov_runs() for path in run["predictions"].values()],
    output:
        summary=FOV_SUMMARY,
        rows=FOV_ROWS,
    params:
        runs=fov_runs(),
        conditions={c: config["conditions"][c] for c in FOV.conditions} if FOV else {},
        token_models=TOKEN_MODELS,  # the others get accuracies only
        bootstrap=config["metrics"],
    log:
        in_logs("fov.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fov.py"


rule fov_report:
    """The FOV table (full image beside each crop) and Fig. 10, drawn from the FOV tables."""
    input:
        summary=FOV_SUMMARY,
        rows=FOV_ROWS,
    output:
        table=FOV_TABLE["parquet"],
        markdown=FOV_TABLE["md"],
        html=report(FOV_TABLE["html"], category="Field of view", caption="../report/fov_table.rst"),
        figure=report(FOV_FIGURE, category="Field of view", caption="../report/fov_fig10.rst"),
        figure_prints=figure_prints(FOV_FIGURE),  # the same figure as PDF and SVG
    params:
        models=TOKEN_MODELS,
        skipped=NO_TOKEN_MODELS,
        notes=random_weight_notes(),
        variant=VARIANTS[0],
    log:
        in_logs("fov_report.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fov_report.py"
