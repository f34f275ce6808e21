"""Run one model over one question set under one image condition.

Inputs: ``questions``, ``images`` (condition folder), ``train_stats``.
Output: the prediction table (schema ``verbmirage.io.PREDICTIONS``).
Settings: ``params.model`` (the model's config entry), ``params.variant``,
``params.batch_size``; wildcards name the model, variant and condition.
"""

from verbmirage.conditions import ImageResolver
from verbmirage.inference import predict
from verbmirage.io import PREDICTIONS, QUESTIONS, read_table, write_table
from verbmirage.joblog import job_log
from verbmirage.models import ModelContext, create_model

with job_log(snakemake.log[0]) as log:
    w = snakemake.wildcards
    context = ModelContext(dataset=w.dataset, train_stats=snakemake.input.train_stats)
    model = create_model(w.model, snakemake.params.model, context)
    questions = read_table(snakemake.input.questions, QUESTIONS)
    predictions = predict(questions, model, ImageResolver(snakemake.input.images), snakemake.params.batch_size)
    provenance = {"model": w.model, "settings": snakemake.params.model, "variant": snakemake.params.variant}
    write_table(predictions, snakemake.output[0], PREDICTIONS, provenance=provenance)
    log.info("%d predictions, %d errors", len(predictions), predictions.error.notna().sum())
