"""Metrics of one run (dataset, condition, model, variant): every question set it answered.

Inputs: ``questions`` and ``predictions`` (one table per set, in ``params.qsets`` order), optional ``tags``
(``image_tags.parquet``: adds the image subsets), optional ``images`` (the folder of a partial condition such
as ``crop``: only the questions on its images count). Output: long-format metric rows.
Settings: ``params.qsets``, ``params.settings`` (config ``metrics``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.benchmark.image_tags import IMAGE_TAGS
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import METRICS
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.metrics import BootstrapSettings, evaluate_run

with job_log(snakemake.log[0]):
    w, p = snakemake.wildcards, snakemake.params
    s = p.settings
    settings = BootstrapSettings.from_config(s)
    tags = read_table(snakemake.input.tags, IMAGE_TAGS) if snakemake.input.get("tags") else None
    tables = list(zip(p.qsets, snakemake.input.questions, snakemake.input.predictions))
    keys = {"dataset": w.dataset, "condition": w.condition, "model": w.model, "variant": w.variant}
    rows = evaluate_run(tables, keys, settings, tags=tags, images_dir=snakemake.input.get("images") or None)
    write_table(rows, snakemake.output[0], METRICS, provenance={"metrics": s, "qsets": list(p.qsets)})
