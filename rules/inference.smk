rule predict_suite:
    """One image shard of model x variant x condition, every question set it asks (the GPU jobs on a cluster).

    The model loads once and each image's prefix is computed once for all its questions. Resumable per set:
    answered rows go to "<output>.parts/<qset>/" as they come and stay there once the job succeeds, so a
    rerun with an added question set asks only that set.
    """
    priority: 5  # model jobs before the light metric jobs that follow them
    input:
        questions=get_run_questions,
        images=PATHS.condition_images,
        train_stats=PATHS.train_stats,
        model_files=get_model_files,
        decision=get_decision_input,  # calibrated decisions: the run's fitted cuts or the content-free images
    output:
        directory(PATHS.suite_shard),
    wildcard_constraints:
        model=alternatives(PLAN.models),
    params:
        qsets=get_run_qsets,
        model=lambda wildcards: PLAN.model_settings(wildcards.model),
        variant=lambda wildcards: PLAN.run_variant_settings(wildcards.variant, wildcards.model),
        n_shards=lambda wildcards: PLAN.n_shards(wildcards.model),
        batch_size=lambda wildcards: PLAN.batch_size(wildcards.model),
        part_size=config["inference"]["part_size"],
        max_error_share=config["inference"]["max_error_share"],
        continue_tokens=config["inference"]["continue_tokens"],
        condition=lambda wildcards: PLAN.condition_settings(wildcards.condition),
    resources:
        gpu=model_resource("gpu", 0),
        mem_mb=model_resource("mem_mb", 4000),
        runtime=model_resource("runtime", 60),
        cpus_per_gpu=model_resource("cpus_per_gpu", 4),
    log:
        PATHS.log("predict_suite"),
    benchmark:
        PATHS.benchmark("predict_suite")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/predict_suite.py"


# One merge job per run (dataset, condition, model, variant) writes the prediction tables of all its sets. A
# rule's outputs cannot depend on its wildcards, so there is one merge rule per (dataset, condition, sets asked,
# variant): the plan's merge groups (src/verbmirage/workflow/plan.py).
for _index, _group in enumerate(PLAN.merge_groups):

    rule:
        name:
            f"merge_predictions_{_index}"
        localrule: True
        input:
            questions=PLAN.questions(_group.dataset, _group.qsets),
            shards=lambda wildcards, g=_group: PLAN.run_shards(
                g.dataset, g.condition, wildcards.model, wildcards.variant
            ),
            images=PLAN.partial_images(_group.dataset, _group.condition),  # crop: only its images' questions
        output:
            PLAN.predictions(_group.dataset, _group.qsets, _group.condition, "{model}", "{variant}"),
        wildcard_constraints:
            model=alternatives(_group.models),
            variant=alternatives([_group.variant]),
        params:
            qsets=_group.qsets,
        log:
            PATHS.log("merge_predictions", dataset=_group.dataset, condition=_group.condition),
        conda:
            "../envs/verbmirage.yaml"
        script:
            "../scripts/merge_predictions.py"
