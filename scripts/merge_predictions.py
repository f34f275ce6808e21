"""Merge the shards of one run into its prediction table (every question exactly once).

Inputs: ``questions``, ``shards``. Output: the prediction table.
"""

from verbmirage.inference import merge_shards
from verbmirage.io import PREDICTIONS, QUESTIONS, read_provenance, read_table, write_table
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]):
    questions = read_table(snakemake.input.questions, QUESTIONS)
    shards = [read_table(path, PREDICTIONS) for path in snakemake.input.shards]
    merged = merge_shards(questions, shards, where=snakemake.output[0])
    provenance = {k: v for k, v in read_provenance(snakemake.input.shards[0]).items() if k not in ("shard",)}
    write_table(merged, snakemake.output[0], PREDICTIONS, provenance=provenance)
