"""Field of view (Fig. 10): the same single-instance questions on the full image and on each crop; rule ``fov``.

Inputs: ``tags`` (``image_tags.parquet``), the question and prediction tables of ``params.runs`` (one dict per
model, variant and set: questions, predictions = {condition: path}). Outputs: ``summary``
(``io.FOV``) and ``rows`` (``io.FOV_ROWS``). Settings: ``params.conditions`` (slug -> config entry, the
first is the reference), ``params.token_models`` (models with token probabilities), ``params.bootstrap``
(config ``metrics``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.fov import fov_tables
from verbmirage.analysis.uncertainty import read_runs
from verbmirage.benchmark.image_tags import IMAGE_TAGS
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import FOV, FOV_ROWS
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.metrics import BootstrapSettings

with job_log(snakemake.log[0]):
    p = snakemake.params
    bootstrap = BootstrapSettings.from_config(p.bootstrap)
    runs = read_runs(p.runs, ("model", "variant", "qset"))
    summary, rows = fov_tables(runs, read_table(snakemake.input.tags, IMAGE_TAGS), dict(p.conditions), bootstrap,
                               p.token_models)
    provenance = {"conditions": dict(p.conditions), "metrics": p.bootstrap}
    write_table(summary, snakemake.output.summary, FOV, provenance=provenance)
    write_table(rows, snakemake.output.rows, FOV_ROWS, provenance=provenance)
