"""Metrics of one prediction table.

Inputs: ``questions``, ``predictions``. Output: long-format metric rows.
Settings: ``params.kind`` ("yn" or "mc"), ``params.settings`` (config ``metrics``).
"""

from verbmirage.io import METRICS, PREDICTIONS, QUESTIONS, read_table, write_table
from verbmirage.joblog import job_log
from verbmirage.metrics import BootstrapSettings, evaluate

with job_log(snakemake.log[0]):
    w, s = snakemake.wildcards, snakemake.params.settings
    settings = BootstrapSettings(s["bootstrap_resamples"], s["confidence_level"], s["seed"])
    keys = {"dataset": w.dataset, "qset": w.qset, "condition": w.condition, "model": w.model, "variant": w.variant}
    rows = evaluate(
        read_table(snakemake.input.questions, QUESTIONS),
        read_table(snakemake.input.predictions, PREDICTIONS),
        snakemake.params.kind, keys, settings,
    )
    write_table(rows, snakemake.output[0], METRICS, provenance={"metrics": s})
