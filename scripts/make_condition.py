"""Apply one image condition to the HICO test images.

Inputs: ``anno`` and ``images`` (or the download that brings them). Settings: ``params.root``.
Output: the condition folder with ``manifest.parquet``.
Settings: ``params.settings`` (config ``conditions.<slug>``), ``params.seed``.
"""

from verbmirage.conditions import apply_condition
from verbmirage.hico import load_hico
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]) as log:
    anno = load_hico(snakemake.params.root)
    images = [anno.image_relpath("test", name) for name in anno.images["test"]]
    manifest = apply_condition(
        anno.root, images, snakemake.output[0], snakemake.wildcards.condition,
        snakemake.params.settings, seed=snakemake.params.seed,
    )
    failed = manifest.error.notna().sum()
    log.info("%d images, %d failed", len(manifest), failed)
