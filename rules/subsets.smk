rule image_tags:
    """Ambiguity and single-instance tags of every HICO test image, from HICO-DET boxes (config `subsets`)."""
    input:
        anno=PLAN.data.hico_anno,
        boxes=PLAN.data.hico_det_boxes,
    output:
        PATHS.image_tags,
    params:
        root=lambda wildcards: PLAN.data.hico_root,  # the dataset folders (their files may come from a download)
        det_root=lambda wildcards: PLAN.data.hico_det_root,
        identity=identity("hico_annotations", "hico_boxes"),
        settings=config["subsets"],
    log:
        PATHS.log("image_tags"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/image_tags.py"
