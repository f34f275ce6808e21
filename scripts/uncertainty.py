"""Token-uncertainty histograms and metric rows (paper Eq. 2, Figs. 9, 12); rule ``uncertainty``.

Inputs: the question tables and the prediction tables of ``params.runs`` (one dict per prediction table:
model, variant, condition, qset, questions, predictions). Outputs: ``hist`` (``io.UNCERTAINTY_HIST``) and
``metrics``, a part of the long metrics table (``io.METRICS``).
Settings: ``params.settings`` (``analysis.uncertainty``), ``params.bootstrap`` (config ``metrics``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.uncertainty import read_runs, uncertainty_tables
from verbmirage.core.io import write_table
from verbmirage.core.schemas import METRICS, UNCERTAINTY_HIST
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.metrics import BootstrapSettings

with job_log(snakemake.log[0]):
    p = snakemake.params
    bootstrap = BootstrapSettings.from_config(p.bootstrap)
    runs = read_runs(p.runs, ("model", "variant", "condition", "qset"), where=True)
    hist, metrics = uncertainty_tables(runs, p.settings, bootstrap)
    provenance = {"uncertainty": repr(p.settings), "metrics": p.bootstrap}
    write_table(hist, snakemake.output.hist, UNCERTAINTY_HIST, provenance=provenance)
    write_table(metrics, snakemake.output.metrics, METRICS, provenance=provenance)
