rule predict:
    """One model x variant x condition x question set (the GPU jobs on a cluster)."""
    input:
        questions=QUESTIONS,
        images=CONDITION_DIR,
        train_stats=TRAIN_STATS,
    output:
        PREDICTIONS,
    wildcard_constraints:
        model=_alternatives(MODELS),
    params:
        model=lambda wildcards: config["models"][wildcards.model],
        variant=lambda wildcards: config["variants"][wildcards.variant],
        batch_size=lambda wildcards: config["models"][wildcards.model].get(
            "batch_size", config["inference"]["batch_size"]
        ),
    resources:
        gpu=model_resource("gpu", 0),
        mem_mb=model_resource("mem_mb", 4000),
        runtime=model_resource("runtime", 60),
        cpus_per_gpu=model_resource("cpus_per_gpu", 4),
    log:
        "logs/predict/{dataset}/{qset}/{condition}/{model}/{variant}.log",
    benchmark:
        "benchmarks/predict/{dataset}/{qset}/{condition}/{model}/{variant}.tsv"
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/predict.py"
