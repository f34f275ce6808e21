"""Metrics of one prediction table.

Inputs: ``questions``, ``predictions``, optional ``tags`` (``image_tags.parquet``: adds the image
subsets), optional ``images`` (the folder of a partial condition such as ``crop``: only the questions on its
images count). Output: long-format metric rows.
Settings: ``params.kind`` ("yn" or "mc"), ``params.settings`` (config ``metrics``).
"""

from verbmirage.conditions import condition_questions
from verbmirage.image_tags import IMAGE_TAGS
from verbmirage.io import METRICS, PREDICTIONS, QUESTIONS, read_table, write_table
from verbmirage.joblog import job_log
from verbmirage.metrics import BootstrapSettings, evaluate

with job_log(snakemake.log[0]):
    w, s = snakemake.wildcards, snakemake.params.settings
    settings = BootstrapSettings(s["bootstrap_resamples"], s["confidence_level"], s["seed"])
    tags = read_table(snakemake.input.tags, IMAGE_TAGS) if snakemake.input.get("tags") else None
    keys = {"dataset": w.dataset, "qset": w.qset, "condition": w.condition, "model": w.model, "variant": w.variant}
    questions = read_table(snakemake.input.questions, QUESTIONS)
    if snakemake.input.get("images"):
        questions = condition_questions(questions, snakemake.input.images)
    rows = evaluate(
        questions,
        read_table(snakemake.input.predictions, PREDICTIONS),
        snakemake.params.kind, keys, settings, tags=tags,
    )
    write_table(rows, snakemake.output[0], METRICS, provenance={"metrics": s})
