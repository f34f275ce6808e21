"""Build one derived model (``models.<slug>.derive``) into its folder; rule ``derive_model``.

Inputs: the base's built folders and the method's data (named in ``params.data``: HICO's root or a
LURE-format pairs file for Nullu). Output: the model folder (``results/models/<slug>``). Settings:
``params.derive`` (method, base, method settings), ``params.base`` (the base entry as its jobs load it).
"""

from verbmirage.workflow.jobserver import delegate

delegate(wait=True)  # a local run's warm job server runs this job (verbmirage.workflow.jobserver); it loads a model

from verbmirage.models.derived import build_derived
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    build_derived(snakemake.wildcards.model, dict(snakemake.params.derive), dict(snakemake.params.base),
                  snakemake.output[0], dict(snakemake.params.data))
