"""Fit a threshold variant's cuts: ask the model its calibration sets (training images, one job, resumable)
and write one cut per YN set.

Inputs: ``questions`` (one calibration table per set, in the order of ``params.qsets``), ``images`` (the
calibration images under the run's condition), ``train_stats``. Outputs: ``cuts`` (JSON: the cut, the
metric at it and at the plain cut 0, n per set), ``answers`` (the model's answers, ``<qset>.parquet``).
Settings: as for predict_suite (``params.model``, ``params.variant``, ``params.batch_size``, ...); nothing is
decoded past the first answer token (only the scores count).
"""

from verbmirage.workflow.jobserver import delegate

delegate(wait=True)  # a local run's warm job server runs this job (verbmirage.workflow.jobserver); it loads a model

from verbmirage.inference.calibration import calibrate
from verbmirage.inference.runs import RunSpec
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    spec = RunSpec(model_slug=w.model, model_settings=p.model, images_dir=snakemake.input.images,
                   variant_settings=p.variant, dataset=w.dataset, train_stats=snakemake.input.train_stats,
                   condition_settings=p.condition, batch_size=p.batch_size, part_size=p.part_size,
                   max_error_share=p.max_error_share)
    fits = calibrate(dict(zip(p.qsets, snakemake.input.questions)), snakemake.output.answers, snakemake.output.cuts,
                     spec, about={"dataset": w.dataset, "condition": w.condition, "variant": w.variant})
    log.info("cuts: %s", {qset: fit.cut for qset, fit in fits.items()})
