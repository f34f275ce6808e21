rule uncertainty:
    """Token uncertainty (Figs. 9, 12): histograms of the answer token's probability, correct vs hallucinated,
    and their metric rows (a part of the metrics table). Reads prediction tables only: no inference."""
    input:
        questions=PLAN.uncertainty.questions,
        predictions=PLAN.uncertainty.predictions,
    output:
        hist=PATHS.analysis("uncertainty_hist.parquet"),
        metrics=PATHS.analysis_metric_part("uncertainty"),
    params:
        runs=PLAN.uncertainty.runs,
        settings=PLAN.uncertainty.settings,
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
        [reported(path) for path in PLAN.uncertainty.figures.values()],
        prints=figure_prints(*PLAN.uncertainty.figures.values()),  # the same figures as PDF and SVG
    params:
        figures=PLAN.uncertainty.figures,
        models=PLAN.uncertainty.models,
        skipped=PLAN.uncertainty.skipped,
        backends=PLAN.model_backends,
        notes=PLAN.stand_in_notes,
        variants=PLAN.uncertainty.figure_variants,  # model -> the variant drawn (analysis.figures)
        variant_entries=config["variants"],  # how the headings name its decoding
        condition=PLAN.uncertainty.figure_condition,
        chosen=PLAN.uncertainty.chosen_figures,  # analysis.uncertainty.figures
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
        questions=PLAN.fov.questions,
        predictions=PLAN.fov.predictions,
    output:
        summary=PLAN.fov.files["summary"],
        rows=PLAN.fov.files["rows"],
    params:
        runs=PLAN.fov.runs,
        conditions=PLAN.fov.conditions,
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
        summary=PLAN.fov.files["summary"],
        rows=PLAN.fov.files["rows"],
    output:
        table=PLAN.fov.files["parquet"],
        markdown=PLAN.fov.files["md"],
        html=reported(PLAN.fov.files["html"]),
        figures=[reported(path) for path in PLAN.fov.files["figures"]],
        figure_prints=figure_prints(*PLAN.fov.files["figures"]),  # the same figures as PDF and SVG
    params:
        models=PLAN.fov.figure_models,
        qsets=PLAN.fov.qsets,
        skipped=PLAN.no_token_models,
        notes=PLAN.stand_in_notes,
        variants=PLAN.fov.figure_variants,  # model -> the variant drawn (analysis.figures)
        variant_entries=config["variants"],  # how the panels name its decoding
    log:
        PATHS.log("fov_report"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fov_report.py"
