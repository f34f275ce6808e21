"""Build one tiny random-weight model (``wildcards.family``) into the output folder."""

from verbmirage.workflow.jobserver import delegate

delegate(wait=True)  # a local run's warm job server runs this job (verbmirage.workflow.jobserver); it loads a model

from verbmirage.core.joblog import job_log
from verbmirage.models.registry import tiny_builder

with job_log(snakemake.log[0]):
    tiny_builder(snakemake.wildcards.family)(snakemake.output[0])
