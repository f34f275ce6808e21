"""Apply one image condition to every image a dataset's question sets ask about.

Inputs: ``source`` (the image folder, or what produces it), ``questions`` (the
dataset's question sets). Output: the condition folder with ``manifest.parquet``.
Settings: ``params.root`` (where ``image`` paths are relative to),
``params.settings`` (config ``conditions.<slug>``), ``params.seed``.
"""

from verbmirage.conditions import apply_condition
from verbmirage.io import QUESTIONS, read_table
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]) as log:
    questions = [read_table(path, QUESTIONS) for path in snakemake.input.questions]  # types and domains checked
    images = sorted(set().union(*(set(frame.image) for frame in questions)))
    manifest = apply_condition(
        snakemake.params.root, images, snakemake.output[0], snakemake.wildcards.condition,
        snakemake.params.settings, seed=snakemake.params.seed,
    )
    log.info("%d images, %d failed", len(manifest), manifest.error.notna().sum())
