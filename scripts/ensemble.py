"""Majority vote of an ensemble's members.

Inputs: the members' prediction tables (in ``params.members`` order).
Output: a prediction table for the ensemble.
"""

from verbmirage.ensembles import majority_vote
from verbmirage.io import PREDICTIONS, read_table, write_table
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]):
    members = {name: read_table(path, PREDICTIONS) for name, path in zip(snakemake.params.members, snakemake.input)}
    votes = majority_vote(members, snakemake.params.kind)
    write_table(votes, snakemake.output[0], PREDICTIONS, provenance={"members": snakemake.params.members})
