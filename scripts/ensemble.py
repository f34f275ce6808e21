"""Majority vote of an ensemble's members, for every question set of the run.

Inputs: the members' prediction tables, set by set (``params.qsets``), members in ``params.members`` order.
Outputs: the ensemble's prediction tables, in ``params.qsets`` order.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.evaluation.ensembles import majority_vote
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.core.joblog import job_log
from verbmirage.benchmark.question_sets import question_kind

with job_log(snakemake.log[0]):
    names, paths = snakemake.params.members, list(snakemake.input)
    for index, (qset, output) in enumerate(zip(snakemake.params.qsets, snakemake.output)):
        tables = paths[index * len(names) : (index + 1) * len(names)]
        members = {name: read_table(path, PREDICTIONS) for name, path in zip(names, tables)}
        votes = majority_vote(members, question_kind(qset))
        write_table(votes, output, PREDICTIONS, provenance={"members": list(names)})
