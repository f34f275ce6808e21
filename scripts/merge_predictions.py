"""Merge a run's shards into one prediction table per question set (every question exactly once).

Inputs: ``questions`` (one table per set, in ``params.qsets`` order), ``shards`` (the output folders of the
run's inference jobs), optional ``images`` (the condition folder of a partial condition such as ``crop``: only
the questions on its images are expected). Outputs: the prediction tables, in ``params.qsets`` order.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.benchmark.conditions import condition_questions
from verbmirage.inference.runs import asked_questions
from verbmirage.inference.shards import merge_suite_shards, shard_provenance, shards_batching
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    shards = snakemake.input.shards
    for qset, questions_path, output in zip(snakemake.params.qsets, snakemake.input.questions, snakemake.output):
        # the run's settings, and each shard's batch sizes where they were sized on a GPU
        provenance = {**shard_provenance(shards[0], qset), **shards_batching(shards, qset)}
        # a model asked a fixed sample of each set (sample_questions): the same sample is expected
        questions = asked_questions(read_table(questions_path, QUESTIONS), provenance.get("model"))
        if snakemake.input.get("images"):
            questions = condition_questions(questions, snakemake.input.images)
        merged = merge_suite_shards(questions, shards, qset, where=output)
        write_table(merged, output, PREDICTIONS, provenance=provenance)
