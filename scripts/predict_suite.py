"""Answer every question set of one image shard with one model (resumable per set).

Inputs: ``questions`` (one table per set, in the order of ``params.qsets``), ``images`` (condition folder),
``train_stats``, ``decision`` (a decision variant's cuts file or content-free images folder; else none).
Output: a folder with ``<qset>.parquet`` per set. Settings: ``params.qsets``,
``params.model`` (the model's config entry), ``params.variant``, ``params.n_shards``, ``params.batch_size``,
``params.part_size``, ``params.max_error_share``, ``params.continue_tokens``, ``params.condition`` (the
condition's settings, part of the resume fingerprint); wildcards name the model and the shard.
"""

from verbmirage.workflow.jobserver import delegate

delegate(wait=True)  # a local run's warm job server runs this job (verbmirage.workflow.jobserver); it loads a model

from verbmirage.inference.runs import RunSpec, run_suite
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    spec = RunSpec(model_slug=w.model, model_settings=p.model, images_dir=snakemake.input.images,
                   variant_settings=p.variant, shard=int(w.shard), n_shards=p.n_shards, dataset=w.dataset,
                   train_stats=snakemake.input.train_stats, condition_settings=p.condition,
                   decision_input=snakemake.input.get("decision") or None, batch_size=p.batch_size,
                   part_size=p.part_size, max_error_share=p.max_error_share, continue_tokens=p.continue_tokens)
    counts = run_suite(dict(zip(p.qsets, snakemake.input.questions)), snakemake.output[0], spec)
    log.info("predictions per set: %s", counts)
