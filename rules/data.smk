rule demo_hico:
    """A mini HICO + HICO-DET in the real on-disk format (only used when a root is the demo folder)."""
    priority: 30  # most of the DAG waits for it: first
    output:
        anno=DEMO_HICO_FILES["anno"],
        images=directory(DEMO_HICO_FILES["images"]),
        bbox=DEMO_HICO_FILES["bbox"],
    params:
        demo=config["demo"],
    log:
        PATHS.log("demo_hico"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_hico.py"


rule demo_charadesego:
    """A mini CharadesEgo in the real format: CSVs, class files, paired ego/exo mp4 videos (PyAV)."""
    priority: 20
    output:
        csv=DEMO_CHARADES_FILES["csv"],
        videos=directory(DEMO_CHARADES_FILES["videos"]),
    params:
        pairs=config["demo"]["charades_pairs"],
        seed=config["demo"]["seed"],
    log:
        PATHS.log("demo_charadesego"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_charadesego.py"


rule tiny_model:
    """A tiny random-weight model of a real transformers class, built offline (tests and demo)."""
    priority: 10
    output:
        directory(TINY_MODEL),
    wildcard_constraints:
        family=alternatives(PLAN.builds.tiny_families),
    log:
        PATHS.log("tiny_model"),
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
        entry=lambda wildcards: PLAN.data.downloads[wildcards.download],
        archive=lambda wildcards: ARCHIVE.format(archive=PLAN.data.downloads[wildcards.download]["archive"]),
        target=DOWNLOADED,
    log:
        PATHS.log("fetch_dataset"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/fetch_dataset.py"
