rule uncertainty:
    """Token uncertainty (Figs. 9, 12): histograms of the answer token's probability, correct vs hallucinated,
    and their metric rows (a part of the metrics table). Reads prediction tables only: no inference."""
    input:
        questions=sorted({run["questions"] for run in PLAN.uncertainty_runs}),
        predictions=[run["predictions"] for run in PLAN.uncertainty_runs],
    output:
        hist=PATHS.analysis("uncertainty_hist.parquet"),
        metrics=PATHS.analysis_metric_part("uncertainty"),
    params:
        runs=PLAN.uncertainty_runs,
        settings=PLAN.uncertainty,
        bootstrap=config["metrics"],
    log:
        PATHS.log("uncertainty"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/uncertainty.py"


rule uncertainty_figures:
    """Figs. 9 (llava role) and 12 (instructblip role), drawn from the histogram table."""
    input:
        PATHS.analysis("uncertainty_hist.parquet"),
    output:
        [reported(path) for path in PLAN.uncertainty_figures.values()],
        prints=figure_prints(*PLAN.uncertainty_figures.values()),  # the same figures as PDF and SVG
    params:
        figures=PLAN.uncertainty_figures,
        models=PLAN.uncertainty_models,
        skipped=PLAN.uncertainty_skipped,
        backends=PLAN.model_backends,
        notes=PLAN.stand_in_notes,
        variants=PLAN.uncertainty_figure_variants,  # model -> the variant drawn (analysis.figures)
        variant_entries=config["variants"],  # how the headings name its decoding
        condition=PLAN.uncertainty.conditions[0] if PLAN.uncertainty else "clean",
        chosen=dict(PLAN.uncertainty.figures) if PLAN.uncertainty else {},  # analysis.uncertainty.figures
    log:
        PATHS.log("uncertainty_figures"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/uncertainty_figures.py"


rule fov:
    """Field of view (Fig. 10): accuracy and token uncertainty on the same single-instance questions,
    full image vs each crop, with paired image-bootstrap intervals. Reads prediction tables only."""
    input:
        tags=PATHS.image_tags,
        questions=sorted({run["questions"] for run in PLAN.fov_runs}),
        predictions=[path for run in PLAN.fov_runs for path in run["predictions"].values()],
    output:
        summary=PLAN.fov_files["summary"],
        rows=PLAN.fov_files["rows"],
    params:
        runs=PLAN.fov_runs,
        conditions={c: config["conditions"][c] for c in PLAN.fov.conditions} if PLAN.fov else {},
        token_models=PLAN.token_models,  # the others get accuracies only
        bootstrap=config["metrics"],
    log:
        PATHS.log("fov"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fov.py"


rule fov_report:
    """The FOV table (full image beside each crop) and Fig. 10 (a page per few models), drawn from the FOV
    tables."""
    input:
        summary=PLAN.fov_files["summary"],
        rows=PLAN.fov_files["rows"],
    output:
        table=PLAN.fov_files["parquet"],
        markdown=PLAN.fov_files["md"],
        html=reported(PLAN.fov_files["html"]),
        figures=[reported(path) for path in PLAN.fov_files["figures"]],
        figure_prints=figure_prints(*PLAN.fov_files["figures"]),  # the same figures as PDF and SVG
    params:
        models=PLAN.fov_figure_models,
        qsets=PLAN.fov.qsets if PLAN.fov else [],
        skipped=PLAN.no_token_models,
        notes=PLAN.stand_in_notes,
        variants=PLAN.fov_figure_variants,  # model -> the variant drawn (analysis.figures)
        variant_entries=config["variants"],  # how the panels name its decoding
    log:
        PATHS.log("fov_report"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fov_report.py"
