"""Error consistency of one model between two image conditions, for every question set both ask.

Inputs: ``questions``, ``reference`` and ``other`` predictions (one table per set, in ``params.qsets``
order), optional ``images`` (the folders of partial conditions such as ``crop``: only the questions on their
images are compared). Output: metric rows under condition ``<reference>_vs_<other>``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.core.io import write_table
from verbmirage.core.schemas import METRICS
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.metrics import BootstrapSettings, consistency_run
from verbmirage.evaluation.tables import consistency_condition

with job_log(snakemake.log[0]):
    w, p = snakemake.wildcards, snakemake.params
    s = p.settings
    settings = BootstrapSettings.from_config(s)
    images = snakemake.input.get("images") or []
    tables = list(zip(p.qsets, snakemake.input.questions, snakemake.input.reference, snakemake.input.other))
    keys = {"dataset": w.dataset, "condition": consistency_condition(w.reference, w.other), "model": w.model,
            "variant": w.variant}
    rows = consistency_run(tables, keys, settings, [images] if isinstance(images, str) else list(images))
    write_table(rows, snakemake.output[0], METRICS, provenance={"metrics": s, "qsets": list(p.qsets)})
