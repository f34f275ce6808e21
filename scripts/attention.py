"""Attention at the answer position for one (condition, model) on every set; rule ``attention``.

Inputs: ``questions`` (one table per set), ``images`` (condition folder), ``boxes`` (HICO-DET's file, read from
``params.det_root``; absent without boxes). Never reads predictions, so it can be added to a finished run.
Output: the job's ``io.ATTENTION`` table. Settings: ``params.model`` (the model entry),
``params.settings`` (``analysis.attention``); wildcards name the model and the condition.
"""

from verbmirage.workflow.jobserver import delegate

delegate(wait=True)  # a local run's warm job server runs this job (verbmirage.workflow.jobserver); it loads a model

from verbmirage.analysis.attention import attention_job
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    attention_job(snakemake.input.questions, snakemake.input.images, snakemake.params.det_root or None, snakemake.wildcards.model,
                  snakemake.params.model, snakemake.params.settings, snakemake.wildcards.condition,
                  snakemake.output[0])
