rule predict_suite:
    """One image shard of model x variant x condition, every question set it asks (the GPU jobs on a cluster).

    The model loads once and each image's prefix is computed once for all its questions. Resumable per set:
    answered rows go to "<output>.parts/<qset>/" as they come and stay there once the job succeeds, so a
    rerun with an added question set asks only that set.
    """
    input:
        questions=suite_questions,
        images=CONDITION_DIR,
        train_stats=TRAIN_STATS,
        model_files=model_files,
    output:
        directory(SUITE_SHARD),
    wildcard_constraints:
        model=_alternatives(MODELS),
    params:
        qsets=suite_qsets,
        model=lambda wildcards: model_settings(wildcards.model),
        variant=lambda wildcards: variant_settings(wildcards.variant),
        n_shards=lambda wildcards: n_shards(wildcards.model),
        batch_size=lambda wildcards: config["models"][wildcards.model].get(
            "batch_size", config["inference"]["batch_size"]
        ),
        part_size=config["inference"]["part_size"],
        max_error_share=config["inference"]["max_error_share"],
        continue_tokens=config["inference"]["continue_tokens"],
        condition=lambda wildcards: condition_settings(wildcards.condition),
    resources:
        gpu=model_resource("gpu", 0),
        mem_mb=model_resource("mem_mb", 4000),
        runtime=model_resource("runtime", 60),
        cpus_per_gpu=model_resource("cpus_per_gpu", 4),
    log:
        "logs/predict/{dataset}/{condition}/{model}/{variant}/{shard}.log",
    benchmark:
        "benchmarks/predict/{dataset}/{condition}/{model}/{variant}/{shard}.tsv"
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/predict_suite.py"


rule merge_predictions:
    """One question set's rows from the shards of a run as its prediction table; fails if a question is missing or doubled."""
    input:
        questions=QUESTIONS,
        shards=suite_shards,
        images=partial_condition_images,  # crop: only the questions on its images are expected
    output:
        PREDICTIONS,
    wildcard_constraints:
        model=_alternatives(MODELS),
    log:
        "logs/merge_predictions/{dataset}/{qset}/{condition}/{model}/{variant}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/merge_predictions.py"
