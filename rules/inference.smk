rule predict_shard:
    """One shard of model x variant x condition x question set (the GPU jobs on a cluster).

    Resumable: answered rows go to "<output>.parts/" as they come; a killed
    job continues from there when rerun.
    """
    input:
        questions=QUESTIONS,
        images=CONDITION_DIR,
        train_stats=TRAIN_STATS,
        model_files=model_files,
    output:
        PREDICTION_SHARD,
    wildcard_constraints:
        model=_alternatives(SHARDED_MODELS),
    params:
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
        "logs/predict/{dataset}/{qset}/{condition}/{model}/{variant}/{shard}.log",
    benchmark:
        "benchmarks/predict/{dataset}/{qset}/{condition}/{model}/{variant}/{shard}.tsv"
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/predict_shard.py"


use rule predict_shard as predict with:
    output:
        PREDICTIONS,
    wildcard_constraints:
        model=_alternatives(UNSHARDED_MODELS),
    log:
        "logs/predict/{dataset}/{qset}/{condition}/{model}/{variant}.log",
    benchmark:
        "benchmarks/predict/{dataset}/{qset}/{condition}/{model}/{variant}.tsv"


rule merge_predictions:
    """The shards of one run as one prediction table; fails if a question is missing or doubled."""
    input:
        questions=QUESTIONS,
        shards=prediction_shards,
        images=partial_condition_images,  # crop: only the questions on its images are expected
    output:
        PREDICTIONS,
    wildcard_constraints:
        model=_alternatives(SHARDED_MODELS),
    log:
        "logs/merge_predictions/{dataset}/{qset}/{condition}/{model}/{variant}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/merge_predictions.py"
