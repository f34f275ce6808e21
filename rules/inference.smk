rule predict_suite:
    """One image shard of model x variant x condition, every question set it asks (the GPU jobs on a cluster).

    The model loads once and each image's prefix is computed once for all its questions. Resumable per set:
    answered rows go to "<output>.parts/<qset>/" as they come and stay there once the job succeeds, so a
    rerun with an added question set asks only that set.
    """
    priority: 5  # model jobs before the light metric jobs that follow them
    input:
        questions=suite_questions,
        images=CONDITION_DIR,
        train_stats=TRAIN_STATS,
        model_files=model_files,
        decision=decision_input,  # calibrated decisions: the run's fitted cuts or the content-free images
    output:
        directory(SUITE_SHARD),
    wildcard_constraints:
        model=_alternatives(MODELS),
    params:
        qsets=suite_qsets,
        model=lambda wildcards: model_settings(wildcards.model),
        variant=lambda wildcards: variant_settings(wildcards.variant, wildcards.model),
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
        in_logs("predict/{dataset}/{condition}/{model}/{variant}/{shard}.log"),
    benchmark:
        in_benchmarks("predict/{dataset}/{condition}/{model}/{variant}/{shard}.tsv")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/predict_suite.py"


# One merge job per run (dataset, condition, model, variant) writes the prediction tables of all its sets. A
# rule's outputs cannot depend on its wildcards, so there is one merge rule per (dataset, condition, sets asked,
# variant), generated here from the config (rules/common.smk:MERGE_GROUPS).
for _index, (_dataset, _condition, _qsets, _models, _variant) in enumerate(MERGE_GROUPS):

    rule:
        name:
            f"merge_predictions_{_index}"
        localrule: True
        input:
            questions=[QUESTIONS.format(dataset=_dataset, qset=q) for q in _qsets],
            shards=lambda wildcards, d=_dataset, c=_condition: run_shards(d, c, wildcards),
            images=partial_images(_dataset, _condition),  # crop: only the questions on its images are expected
        output:
            [PREDICTIONS.format(dataset=_dataset, qset=q, condition=_condition, model="{model}", variant="{variant}")
             for q in _qsets],
        wildcard_constraints:
            model=_alternatives(_models),
            variant=_alternatives([_variant]),
        params:
            qsets=_qsets,
        log:
            in_logs(f"merge_predictions/{_dataset}/{_condition}/{{model}}/{{variant}}.log"),
        conda:
            "../envs/verbmirage.yaml"
        script:
            "../scripts/merge_predictions.py"
