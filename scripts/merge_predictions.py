"""Merge the shards of one run into its prediction table (every question exactly once).

Inputs: ``questions``, ``shards``, optional ``images`` (the condition folder of a partial condition such
as ``crop``: only the questions on its images are expected). Output: the prediction table.
"""

from verbmirage.conditions import condition_questions

from verbmirage.inference import merge_shards
from verbmirage.io import PREDICTIONS, QUESTIONS, read_provenance, read_table, write_table
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]):
    questions = read_table(snakemake.input.questions, QUESTIONS)
    if snakemake.input.get("images"):
        questions = condition_questions(questions, snakemake.input.images)
    shards = [read_table(path, PREDICTIONS) for path in snakemake.input.shards]
    merged = merge_shards(questions, shards, where=snakemake.output[0])
    provenance = {k: v for k, v in read_provenance(snakemake.input.shards[0]).items() if k not in ("shard",)}
    write_table(merged, snakemake.output[0], PREDICTIONS, provenance=provenance)
