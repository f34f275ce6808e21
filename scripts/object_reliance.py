"""Object reliance of the configured models (paper Fig. 15, Tables 6 and 7); rule ``object_reliance``.

Inputs: ``anno`` (HICO's anno.mat, or the download that brings it: ``params.hico_root`` is read),
``questions`` (the four sets in ``params.qsets`` order), ``predictions`` (one per ``params.prediction_keys`` entry,
[model, qset]), optional ``images`` (a box condition's folder: only its questions count).
Outputs: ``objects`` (object_reliance.parquet), ``verbs`` (verb_influence.parquet) and ``metrics`` (the
overlap-index and IoU rows, a part of the long metrics table).
Settings: ``params.settings`` (config ``analysis.object_reliance``), ``params.models``, ``params.condition``,
``params.variant``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.object_reliance import object_reliance
from verbmirage.analysis.object_reliance_settings import RelianceSettings
from verbmirage.benchmark.conditions import condition_questions
from verbmirage.data.hico import load_hico
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import METRICS, OBJECT_RELIANCE, PREDICTIONS, VERB_INFLUENCE
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    p = snakemake.params
    questions = {qset: read_table(path, QUESTIONS) for qset, path in zip(p.qsets, snakemake.input.questions)}
    if snakemake.input.get("images"):
        questions = {qset: condition_questions(frame, snakemake.input.images) for qset, frame in questions.items()}
    predictions = {tuple(key): read_table(path, PREDICTIONS) for key, path in zip(p.prediction_keys, snakemake.input.predictions)}
    settings = RelianceSettings.from_config(p.settings)
    keys = {"dataset": "hico", "condition": p.condition, "variant": p.variant}
    objects, verbs, rows = object_reliance(questions, predictions, load_hico(p.hico_root), p.models, settings, keys)
    provenance = {"object_reliance": p.settings, "models": list(p.models), **keys}
    write_table(objects, snakemake.output.objects, OBJECT_RELIANCE, provenance=provenance)
    write_table(verbs, snakemake.output.verbs, VERB_INFLUENCE, provenance=provenance)
    write_table(rows, snakemake.output.metrics, METRICS, provenance=provenance)
    for row in rows.itertuples():
        log.info("%s %s: %.4f (n=%d)", row.metric, row.model, row.value, row.n)
