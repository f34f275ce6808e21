rule demo_hico:
    """A mini HICO + HICO-DET in the real on-disk format (only used when a root is the demo folder)."""
    priority: 30  # most of the DAG waits for it: first
    output:
        anno=f"{DEMO_HICO_ROOT}/anno.mat",
        images=directory(f"{DEMO_HICO_ROOT}/images"),
        bbox=f"{DEMO_HICO_DET_ROOT}/anno_bbox.mat",
    params:
        demo=config["demo"],
    log:
        in_logs("demo_hico.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_hico.py"


rule demo_charadesego:
    """A mini CharadesEgo in the real format: CSVs, class files, paired ego/exo mp4 videos (PyAV)."""
    priority: 20
    output:
        csv=f"{DEMO_CHARADES_ROOT}/CharadesEgo/CharadesEgo_v1_test.csv",
        videos=directory(f"{DEMO_CHARADES_ROOT}/CharadesEgo_v1_480"),
    params:
        pairs=config["demo"]["charades_pairs"],
        seed=config["demo"]["seed"],
    log:
        in_logs("demo_charadesego.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_charadesego.py"


rule tiny_model:
    """A tiny random-weight model of a real transformers class, built offline (tests and demo)."""
    priority: 10
    output:
        directory("resources/models/tiny_{family}"),
    wildcard_constraints:
        family=_alternatives(TINY_FAMILIES),
    log:
        in_logs("tiny_model/{family}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/build_tiny_model.py"


rule fetch_dataset:
    """Download (resumable), verify and unpack one archive of `downloads:`, or link the user's folder.

    The flag records source, archive, size and sha256; a changed entry reruns the job, which
    fetches and unpacks again whatever no longer matches (docs/downloads.md)."""
    output:
        DOWNLOAD_DONE,
    params:
        entry=lambda wildcards: DOWNLOADS[wildcards.download],
        archive=lambda wildcards: f"resources/archives/{DOWNLOADS[wildcards.download]['archive']}",
        target=DOWNLOADED,
    log:
        in_logs("fetch_dataset/{download}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fetch_dataset.py"
