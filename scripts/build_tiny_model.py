"""Build one tiny random-weight model (``wildcards.family``) into the output folder."""

from verbmirage.jobserver import delegate

delegate(wait=True)  # a local run's warm job server runs this job (verbmirage.jobserver); it loads a model

from verbmirage.joblog import job_log
from verbmirage.tiny import BUILDERS

with job_log(snakemake.log[0]):
    BUILDERS[snakemake.wildcards.family](snakemake.output[0])
