rule metric_part:
    """Metrics of one run (dataset, condition, model, variant) on every set it answered, with bootstrap intervals."""
    input:
        questions=lambda wildcards: run_tables(wildcards, QUESTIONS),
        predictions=lambda wildcards: run_tables(wildcards, PREDICTIONS),
        tags=image_tags_input,  # HICO-DET image subsets (only when datasets.hico.det_root is set)
        images=partial_condition_images,  # crop: only the questions on its images count
    output:
        METRIC_PART,
    wildcard_constraints:
        model=_alternatives(MODELS + list(ENSEMBLES)),
    params:
        qsets=run_qsets,
        settings=config["metrics"],
    log:
        in_logs("metric_part/{dataset}/{condition}/{model}/{variant}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/metric_part.py"


rule consistency_part:
    """Error consistency (Geirhos et al. 2020) of one model between two conditions, on every set both ask."""
    input:
        questions=lambda wildcards: pair_tables(wildcards, QUESTIONS),
        reference=lambda wildcards: pair_tables(wildcards, PREDICTIONS, "reference"),
        other=lambda wildcards: pair_tables(wildcards, PREDICTIONS, "other"),
        images=partial_pair_images,  # crop: compare on the questions of its images only
    output:
        CONSISTENCY_PART,
    wildcard_constraints:
        model=_alternatives(MODELS + list(ENSEMBLES)),
    params:
        qsets=pair_qsets,
        settings=config["metrics"],
    log:
        in_logs("consistency_part/{dataset}/{reference}_vs_{other}/{model}/{variant}.log"),
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
        in_logs("metrics.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/collect_metrics.py"
