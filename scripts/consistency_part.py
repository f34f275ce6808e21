"""Error consistency of one model between two image conditions.

Inputs: ``questions``, ``reference`` and ``other`` predictions, optional ``images`` (the folders of
partial conditions such as ``crop``: only the questions on their images are compared). Output: metric rows
under condition ``<reference>_vs_<other>``.
"""

import pandas as pd

from verbmirage.conditions import condition_questions

from verbmirage.io import METRICS, PREDICTIONS, QUESTIONS, read_table, write_table
from verbmirage.joblog import job_log
from verbmirage.metrics import BootstrapSettings, correctness, evaluate_consistency
from verbmirage.tables import consistency_condition

with job_log(snakemake.log[0]):
    w, s, kind = snakemake.wildcards, snakemake.params.settings, snakemake.params.kind
    settings = BootstrapSettings(s["bootstrap_resamples"], s["confidence_level"], s["seed"])
    questions = read_table(snakemake.input.questions, QUESTIONS)
    images = snakemake.input.get("images") or []
    for folder in [images] if isinstance(images, str) else images:
        questions = condition_questions(questions, folder)
    predictions = {side: read_table(snakemake.input[side], PREDICTIONS) for side in ("reference", "other")}
    if images:  # the full-image run also answered questions the crop does not ask: leave those out
        predictions = {side: frame[frame.question_id.isin(set(questions.question_id))]
                       for side, frame in predictions.items()}
    correct_reference = correctness(questions, predictions["reference"], kind)
    correct_other = correctness(questions, predictions["other"], kind)
    keys = {
        "dataset": w.dataset, "qset": w.qset, "condition": consistency_condition(w.reference, w.other),
        "model": w.model, "variant": w.variant,
    }
    if images and questions.empty:  # a crop condition without single-instance questions: nothing to compare
        rows = pd.DataFrame(columns=METRICS.names)
    else:
        rows = evaluate_consistency(correct_reference, correct_other, keys, settings)
    write_table(rows, snakemake.output[0], METRICS, provenance={"metrics": s})
