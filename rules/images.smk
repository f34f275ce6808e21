rule image_condition:
    """The images a dataset's questions ask about, as a model sees them under one condition (+ manifest.parquet)."""
    priority: 20
    input:
        source=lambda wildcards: PLAN.data.image_source(wildcards.dataset),
        questions=get_dataset_questions,
        # crop: the union boxes of the single-instance images
        tags=lambda wildcards: PLAN.condition_tags(wildcards.condition),
    output:
        directory(PATHS.condition_images),
    params:
        root=lambda wildcards: PLAN.data.image_root(wildcards.dataset),
        identity=get_image_identity,  # root and the images folder's listing (names, sizes)
        settings=lambda wildcards: PLAN.condition_settings(wildcards.condition),
        seed=config["condition_seed"],
    log:
        PATHS.log("image_condition"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_condition.py"
