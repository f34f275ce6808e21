"""Error consistency of one model between two image conditions.

Inputs: ``questions``, ``reference`` and ``other`` predictions. Output: metric rows
under condition ``<reference>_vs_<other>``.
"""

from verbmirage.io import METRICS, PREDICTIONS, QUESTIONS, read_table, write_table
from verbmirage.joblog import job_log
from verbmirage.metrics import BootstrapSettings, correctness, evaluate_consistency
from verbmirage.tables import consistency_condition

with job_log(snakemake.log[0]):
    w, s, kind = snakemake.wildcards, snakemake.params.settings, snakemake.params.kind
    settings = BootstrapSettings(s["bootstrap_resamples"], s["confidence_level"], s["seed"])
    questions = read_table(snakemake.input.questions, QUESTIONS)
    correct_reference = correctness(questions, read_table(snakemake.input.reference, PREDICTIONS), kind)
    correct_other = correctness(questions, read_table(snakemake.input.other, PREDICTIONS), kind)
    keys = {
        "dataset": w.dataset, "qset": w.qset, "condition": consistency_condition(w.reference, w.other),
        "model": w.model, "variant": w.variant,
    }
    rows = evaluate_consistency(correct_reference, correct_other, keys, settings)
    write_table(rows, snakemake.output[0], METRICS, provenance={"metrics": s})
