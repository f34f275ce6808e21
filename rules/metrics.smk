rule metric_part:
    """Metrics of one prediction table, per subset, with bootstrap intervals."""
    input:
        questions=QUESTIONS,
        predictions=PREDICTIONS,
        tags=image_tags_input,  # HICO-DET image subsets (only when datasets.hico.det_root is set)
        images=partial_condition_images,  # crop: only the questions on its images count
    output:
        METRIC_PART,
    wildcard_constraints:
        model=_alternatives(MODELS + list(ENSEMBLES)),
    params:
        kind=lambda wildcards: question_kind(wildcards.qset),
        settings=config["metrics"],
    log:
        "logs/metric_part/{dataset}/{qset}/{condition}/{model}/{variant}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/metric_part.py"


rule consistency_part:
    """Error consistency (Geirhos et al. 2020) of one model between two conditions."""
    input:
        questions=QUESTIONS,
        reference=PREDICTIONS.replace("{condition}", "{reference}"),
        other=PREDICTIONS.replace("{condition}", "{other}"),
        images=partial_pair_images,  # crop: compare on the questions of its images only
    output:
        CONSISTENCY_PART,
    wildcard_constraints:
        model=_alternatives(MODELS + list(ENSEMBLES)),
    params:
        kind=lambda wildcards: question_kind(wildcards.qset),
        settings=config["metrics"],
    log:
        "logs/consistency_part/{dataset}/{qset}/{reference}_vs_{other}/{model}/{variant}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/consistency_part.py"


rule metrics:
    """The long metrics table: dataset, qset, condition, model, variant, subset, metric, value, CI, n."""
    input:
        all_scored() + all_consistency() + RELIANCE_METRIC_PARTS,  # + object reliance (Tables 6, 7)
        UNCERTAINTY_METRIC_PARTS,  # + conf_mean, conf_median, conf_auroc (rule uncertainty)
        KNOWN_OBJECT_METRIC_PARTS,  # + map, map_voc11 of the Known-Object ranking (rule known_object)
    output:
        METRICS,
    log:
        "logs/metrics.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/collect_metrics.py"
