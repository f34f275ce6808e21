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


rule tiny_model:
    """A tiny random-weight model of a real transformers class, built offline (tests and demo)."""
    output:
        directory("resources/models/tiny_{family}"),
    wildcard_constraints:
        family=_alternatives(TINY_FAMILIES),
    log:
        "logs/tiny_model/{family}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/build_tiny_model.py"


rule fetch_dataset:
    """Download (resumable), verify and unpack one archive of `downloads:`, or link the user's folder."""
    output:
        touch(DOWNLOAD_DONE),
    params:
        entry=lambda wildcards: DOWNLOADS[wildcards.download],
        archive=lambda wildcards: f"resources/archives/{DOWNLOADS[wildcards.download]['archive']}",
        target=DOWNLOADED,
    log:
        "logs/fetch_dataset/{download}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fetch_dataset.py"
