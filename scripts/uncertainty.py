"""Token-uncertainty histograms and metric rows (paper Eq. 2, Figs. 9, 12); rule ``uncertainty``.

Inputs: the question tables and the prediction tables of ``params.runs`` (one dict per prediction table:
model, variant, condition, qset, questions, predictions). Outputs: ``hist`` (``io.UNCERTAINTY_HIST``) and
``metrics``, a part of the long metrics table (``io.METRICS``).
Settings: ``params.settings`` (``analysis.uncertainty``), ``params.bootstrap`` (config ``metrics``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.uncertainty import uncertainty_tables
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import METRICS, PREDICTIONS, UNCERTAINTY_HIST
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.metrics import BootstrapSettings

with job_log(snakemake.log[0]):
    p = snakemake.params
    bootstrap = BootstrapSettings.from_config(p.bootstrap)
    questions = {path: read_table(path, QUESTIONS) for path in snakemake.input.questions}
    runs = [
        ({**{k: run[k] for k in ("model", "variant", "condition", "qset")}, "where": run["predictions"]},
         questions[run["questions"]], read_table(run["predictions"], PREDICTIONS))
        for run in p.runs
    ]
    hist, metrics = uncertainty_tables(runs, p.settings, bootstrap)
    provenance = {"uncertainty": repr(p.settings), "metrics": p.bootstrap}
    write_table(hist, snakemake.output.hist, UNCERTAINTY_HIST, provenance=provenance)
    write_table(metrics, snakemake.output.metrics, METRICS, provenance=provenance)
