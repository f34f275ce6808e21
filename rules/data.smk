rule demo_hico:
    """A mini HICO + HICO-DET in the real on-disk format (only used when a root is the demo folder)."""
    output:
        anno=f"{DEMO_HICO_ROOT}/anno.mat",
        images=directory(f"{DEMO_HICO_ROOT}/images"),
        bbox=f"{DEMO_HICO_DET_ROOT}/anno_bbox.mat",
    params:
        demo=config["demo"],
    log:
        "logs/demo_hico.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_hico.py"
