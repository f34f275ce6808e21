rule known_object:
    """Known-Object AP per HOI (non-interpolated and VOC 11-point) and mAP rows with image-bootstrap intervals.

    Reads the question table and the configured prediction tables: adding it to a finished run
    starts only this rule, the figure and the metrics collection.
    """
    input:
        questions=PLAN.known_object.questions,
        predictions=list(PLAN.known_object.runs.values()),
        boxes=PLAN.data.hico_det_boxes,  # HICO-DET's rare HOIs (without boxes: the question table's rare flag)
        images=list(PLAN.known_object.partial_images.values()),  # crop: only the questions on its images
    output:
        ap=PATHS.known_object_ap,
        metrics=PATHS.analysis_metric_part("known_object"),
    params:
        runs=PLAN.known_object.runs,
        settings=PLAN.known_object.params,
        det_root=lambda wildcards: PLAN.data.hico_det_root,  # the folder (its file may come from a download)
        identity=identity("hico_boxes"),
        images=PLAN.known_object.partial_images,
    log:
        PATHS.log("known_object"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/known_object.py"


rule known_object_figure:
    """Fig. 11: ΔAP per HOI class, each model minus the reference (CLIP), from the AP table only."""
    input:
        ap=PATHS.known_object_ap,
        metrics=PATHS.analysis_metric_part("known_object"),
    output:
        reported(PLAN.known_object.figure),
        prints=figure_prints(PLAN.known_object.figure),  # the same figure as PDF and SVG
    params:
        reference=PLAN.known_object.params.get("reference_model"),
        metric=PLAN.known_object.params.get("figure_metric"),
        models=PLAN.known_object.model_entries,
        paper_names=PLAN.paper_names,  # the paper's mAP beside a model whose paper_name it published
    log:
        PATHS.log("known_object_figure"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/known_object_figure.py"
