rule image_condition:
    """The images a dataset's questions ask about, as a model sees them under one condition (+ manifest.parquet)."""
    priority: 20
    input:
        source=image_source,
        questions=dataset_questions,
        tags=condition_tags_input,  # crop: the union boxes of the single-instance images
    output:
        directory(CONDITION_DIR),
    params:
        root=image_root,
        identity=image_identity,  # root and the images folder's listing (names, sizes)
        settings=lambda wildcards: condition_settings(wildcards.condition),
        seed=config["condition_seed"],
    log:
        in_logs("image_condition/{dataset}/{condition}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_condition.py"
