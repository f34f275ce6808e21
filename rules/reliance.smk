rule object_reliance:
    """Per-object accuracy with and without the object named, influenced verbs, Tables 6/7 metric rows.

    Reads the four verb question sets, every analysed model's answers under one condition, and HICO's
    test labels (which objects each question is about); no model runs.
    """
    input:
        anno=PLAN.data.hico_anno,
        questions=PLAN.reliance.questions,
        predictions=PLAN.reliance.predictions,
        images=PLAN.reliance.condition_images,  # a box condition (crop): only the questions on its images
    output:
        objects=PLAN.reliance.files["objects"],
        verbs=PLAN.reliance.files["verbs"],
        metrics=PLAN.reliance.files["metrics"],
    params:
        qsets=PLAN.reliance.qsets,
        prediction_keys=PLAN.reliance.prediction_keys,
        models=PLAN.reliance.models,
        settings=PLAN.reliance.settings,
        condition=PLAN.reliance.settings.get("condition"),
        variant=PLAN.reliance.settings.get("variant"),
        hico_root=lambda wildcards: PLAN.data.hico_root,  # the folder (its files may come from a download)
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
        objects=PLAN.reliance.files["objects"],
        verbs=PLAN.reliance.files["verbs"],
    output:  # Tables 6 and 7 as Parquet, Markdown and HTML; the HTML in the report beside Tables 1-4
        table6=[*PATHS.tables(6)[:2], reported(PATHS.table(6, "html"))],
        table7=[*PATHS.tables(7)[:2], reported(PATHS.table(7, "html"))],
        figure=reported(PLAN.reliance.files["figure"]),
        figure_prints=figure_prints(PLAN.reliance.files["figure"]),  # the same figure as PDF and SVG
    params:
        models=PLAN.reliance.models,
        figure_model=PLAN.reliance.settings.get("figure_model"),
        condition=PLAN.reliance.settings.get("condition"),
        variant=PLAN.reliance.settings.get("variant"),
        min_questions=PLAN.reliance.settings.get("min_questions"),
        notes=PLAN.reliance.figure_notes,
    log:
        PATHS.log("reliance_report"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/reliance_report.py"
