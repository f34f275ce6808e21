rule known_object:
    """Known-Object AP per HOI (non-interpolated and VOC 11-point) and mAP rows with image-bootstrap intervals.

    Reads the question table and the configured prediction tables: adding it to a finished run
    starts only this rule, the figure and the metrics collection.
    """
    input:
        questions=KNOWN_OBJECT_QUESTIONS,
        predictions=list(KNOWN_OBJECT_RUNS.values()),
        boxes=HICO_DET_BOXES,  # HICO-DET's rare HOIs (without boxes: the question table's rare flag)
        images=list(KNOWN_OBJECT_PARTIAL_IMAGES.values()),  # crop: only the questions on its images
    output:
        ap=KNOWN_OBJECT_AP,
        metrics=KNOWN_OBJECT_METRIC_PART,
    params:
        runs=KNOWN_OBJECT_RUNS,
        settings=KNOWN_OBJECT_PARAMS,
        det_root=HICO_DET_ROOT,  # the folder (its file may come from a download)
        identity=identity("hico_boxes"),
        images=KNOWN_OBJECT_PARTIAL_IMAGES,
    log:
        in_logs("known_object.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/known_object.py"


rule known_object_figure:
    """Fig. 11: ΔAP per HOI class, each model minus the reference (CLIP), from the AP table only."""
    input:
        ap=KNOWN_OBJECT_AP,
        metrics=KNOWN_OBJECT_METRIC_PART,
    output:
        report(KNOWN_OBJECT_FIGURE, category="Known-Object mAP", caption="../report/known_object_fig11.rst"),
        prints=figure_prints(KNOWN_OBJECT_FIGURE),  # the same figure as PDF and SVG
    params:
        reference=KNOWN_OBJECT_PARAMS.get("reference_model"),
        metric=KNOWN_OBJECT_PARAMS.get("figure_metric"),
        models=KNOWN_OBJECT_MODEL_ENTRIES,
        paper_names=TABLE_PAPER_NAMES,  # the paper's mAP beside a model whose paper_name it published
    log:
        in_logs("known_object_figure.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/known_object_figure.py"
