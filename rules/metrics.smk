rule metric_part:
    """Metrics of one run (dataset, condition, model, variant) on every set it answered, with bootstrap intervals."""
    input:
        questions=get_run_questions,
        predictions=get_run_predictions,
        tags=lambda wildcards: PLAN.metric_tags(wildcards.dataset),  # HICO-DET image subsets (with det_root)
        images=get_partial_images,  # crop: only the questions on its images count
    output:
        PATHS.metric_part,
    wildcard_constraints:
        model=alternatives(PLAN.models + list(PLAN.ensembles)),
    params:
        qsets=get_run_qsets,
        settings=config["metrics"],
    log:
        PATHS.log("metric_part"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/metric_part.py"


rule consistency_part:
    """Error consistency (Geirhos et al. 2020) of one model between two conditions, on every set both ask."""
    input:
        questions=get_pair_questions,
        reference=get_pair_predictions("reference"),
        other=get_pair_predictions("other"),
        images=get_pair_partial_images,  # crop: compare on the questions of its images only
    output:
        PATHS.consistency_part,
    wildcard_constraints:
        model=alternatives(PLAN.models + list(PLAN.ensembles)),
    params:
        qsets=get_pair_qsets,
        settings=config["metrics"],
    log:
        PATHS.log("consistency_part"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/consistency_part.py"


rule metrics:
    """The long metrics table: dataset, qset, condition, model, variant, subset, metric, value, CI, n."""
    input:
        # every run's and pair's part, then object reliance (Tables 6, 7), uncertainty (conf_mean, conf_median,
        # conf_auroc) and the Known-Object ranking (map, map_voc11)
        PLAN.metric_parts,
    output:
        PATHS.metrics,
    log:
        PATHS.log("metrics"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/collect_metrics.py"
