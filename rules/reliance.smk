rule object_reliance:
    """Per-object accuracy with and without the object named, influenced verbs, Tables 6/7 metric rows.

    Reads the four verb question sets, every analysed model's answers under one condition, and HICO's
    test labels (which objects each question is about); no model runs.
    """
    input:
        anno=HICO_ANNO,
        questions=reliance_questions(),
        predictions=reliance_predictions(),
        images=reliance_condition_images(),  # a box condition (crop): only the questions on its images
    output:
        objects=RELIANCE_OBJECTS,
        verbs=RELIANCE_VERBS,
        metrics=RELIANCE_METRIC_PART,
    params:
        qsets=RELIANCE_QSETS,
        prediction_keys=reliance_prediction_keys(),
        models=RELIANCE_MODELS,
        settings=RELIANCE_SETTINGS,
        condition=RELIANCE_SETTINGS.get("condition"),
        variant=RELIANCE_SETTINGS.get("variant"),
        hico_root=HICO_ROOT,
        identity=identity("hico_annotations"),
    log:
        in_logs("object_reliance.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/object_reliance.py"


rule reliance_report:
    """Paper Tables 6 and 7 (our rows beside the paper's) and Fig. 15, from the Parquet tables only."""
    input:
        metrics=METRICS,
        objects=RELIANCE_OBJECTS,
        verbs=RELIANCE_VERBS,
    output:
        table6=reliance_table_outputs(6),
        table7=reliance_table_outputs(7),
        figure=report(RELIANCE_FIGURE, category="Paper figures", caption="../report/fig15_object_reliance.rst"),
        figure_prints=figure_prints(RELIANCE_FIGURE),  # the same figure as PDF and SVG
    params:
        models=RELIANCE_MODELS,
        figure_model=RELIANCE_SETTINGS.get("figure_model"),
        condition=RELIANCE_SETTINGS.get("condition"),
        variant=RELIANCE_SETTINGS.get("variant"),
        min_questions=RELIANCE_SETTINGS.get("min_questions"),
        notes=reliance_figure_notes(),
    log:
        in_logs("reliance_report.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/reliance_report.py"
