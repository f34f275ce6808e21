rule image_condition:
    """The test images as a model sees them under one condition, plus manifest.parquet."""
    input:
        anno=HICO_ANNO,
        images=HICO_IMAGES,
    output:
        directory(CONDITION_DIR),
    params:
        root=lambda wildcards: HICO_ROOT,  # the dataset folder (its files may come from a download)
        settings=lambda wildcards: config["conditions"][wildcards.condition],
        seed=config["condition_seed"],
    log:
        "logs/image_condition/{dataset}/{condition}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_condition.py"
