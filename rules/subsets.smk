rule image_tags:
    """Ambiguity and single-instance tags of every HICO test image, from HICO-DET boxes (config `subsets`)."""
    input:
        anno=HICO_ANNO,
        boxes=HICO_DET_BOXES,
    output:
        IMAGE_TAGS,
    params:
        root=lambda wildcards: HICO_ROOT,  # the dataset folders (their files may come from a download)
        det_root=lambda wildcards: HICO_DET_ROOT,
        identity=identity("hico_annotations", "hico_boxes"),
        settings=config["subsets"],
    log:
        in_logs("image_tags.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/image_tags.py"
