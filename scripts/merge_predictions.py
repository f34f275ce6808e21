"""Merge one question set's rows from the shards of a run into its prediction table (every question exactly once).

Inputs: ``questions``, ``shards`` (the output folders of the run's inference jobs), optional ``images`` (the
condition folder of a partial condition such as ``crop``: only the questions on its images are expected).
Output: the prediction table. Wildcards: ``qset``.
"""

from verbmirage.conditions import condition_questions

from verbmirage.inference import merge_suite_shards, suite_table
from verbmirage.io import PREDICTIONS, QUESTIONS, read_provenance, read_table, write_table
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]):
    qset = snakemake.wildcards.qset
    questions = read_table(snakemake.input.questions, QUESTIONS)
    if snakemake.input.get("images"):
        questions = condition_questions(questions, snakemake.input.images)
    merged = merge_suite_shards(questions, snakemake.input.shards, qset, where=snakemake.output[0])
    provenance = {k: v for k, v in read_provenance(suite_table(snakemake.input.shards[0], qset)).items()
                  if k not in ("shard", "qset")}
    write_table(merged, snakemake.output[0], PREDICTIONS, provenance=provenance)
