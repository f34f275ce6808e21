rule object_reliance:
    """Per-object accuracy with and without the object named, influenced verbs, Tables 6/7 metric rows.

    Reads the four verb question sets, every analysed model's answers under one condition, and HICO's
    test labels (which objects each question is about); no model runs.
    """
    input:
        anno=PLAN.hico_anno,
        questions=PLAN.reliance_questions,
        predictions=PLAN.reliance_predictions,
        images=PLAN.reliance_condition_images,  # a box condition (crop): only the questions on its images
    output:
        objects=PLAN.reliance_files["objects"],
        verbs=PLAN.reliance_files["verbs"],
        metrics=PLAN.reliance_files["metrics"],
    params:
        qsets=PLAN.reliance_qsets,
        prediction_keys=PLAN.reliance_prediction_keys,
        models=PLAN.reliance_models,
        settings=PLAN.reliance_settings,
        condition=PLAN.reliance_settings.get("condition"),
        variant=PLAN.reliance_settings.get("variant"),
        hico_root=lambda wildcards: PLAN.hico_root,  # the folder (its files may come from a download)
        identity=identity("hico_annotations"),
    log:
        PATHS.log("object_reliance"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/object_reliance.py"


rule reliance_report:
    """Paper Tables 6 and 7 (our rows beside the paper's) and Fig. 15, from the Parquet tables only."""
    input:
        metrics=PATHS.metrics,
        objects=PLAN.reliance_files["objects"],
        verbs=PLAN.reliance_files["verbs"],
    output:  # Tables 6 and 7 as Parquet, Markdown and HTML; the HTML in the report beside Tables 1-4
        table6=[*PATHS.tables(6)[:2], reported(PATHS.table(6, "html"))],
        table7=[*PATHS.tables(7)[:2], reported(PATHS.table(7, "html"))],
        figure=reported(PLAN.reliance_files["figure"]),
        figure_prints=figure_prints(PLAN.reliance_files["figure"]),  # the same figure as PDF and SVG
    params:
        models=PLAN.reliance_models,
        figure_model=PLAN.reliance_settings.get("figure_model"),
        condition=PLAN.reliance_settings.get("condition"),
        variant=PLAN.reliance_settings.get("variant"),
        min_questions=PLAN.reliance_settings.get("min_questions"),
        notes=PLAN.reliance_figure_notes,
    log:
        PATHS.log("reliance_report"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/reliance_report.py"
