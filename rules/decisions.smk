# Calibrated decisions (variants.<slug>.decision; src/verbmirage/variants/decisions.py, docs/variants.md): the
# calibration sets and images (training split only), the threshold fit (a GPU job per run) and the
# content-free images. The prediction jobs of decision variants take these as `decision` input.


rule calibration_question_set:
    """One YN set's calibration questions: the benchmark's protocol on seeded training images (never test)."""
    input:
        anno=HICO_ANNO,
    output:
        CALIBRATION_QUESTIONS,
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: HICO_ROOT,
        identity=identity("hico_annotations"),
        settings=config["questions"],
        images=DECISIONS["calibration_images"],
    log:
        in_logs("calibration_question_set/{dataset}/{qset}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/calibration_question_set.py"


rule calibration_images:
    """The calibration training images as a model sees them under one condition (+ manifest.parquet)."""
    input:
        source=HICO_IMAGES,
        questions=calibration_condition_tables,
    output:
        directory(CALIBRATION_IMAGES),
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: HICO_ROOT,
        identity=identity("hico_images"),
        settings=lambda wildcards: condition_settings(wildcards.condition),
        seed=config["condition_seed"],
    log:
        in_logs("calibration_images/{dataset}/{condition}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_condition.py"


rule calibrate_decision:
    """A threshold variant's cuts for one run: the model answers its calibration sets (one job, resumable)."""
    priority: 5
    input:
        questions=calibration_run_tables,
        images=CALIBRATION_IMAGES,
        train_stats=TRAIN_STATS,
        model_files=model_files,
    output:
        cuts=CALIBRATION_CUTS,
        answers=directory(CALIBRATION_ANSWERS),
    wildcard_constraints:
        dataset="hico",
        model=_alternatives(MODELS),
        variant=_alternatives(DECISIONS["threshold"]),
    params:
        qsets=lambda wildcards: run_calibration_qsets(wildcards.dataset, wildcards.condition, wildcards.model,
                                                      wildcards.variant),
        model=lambda wildcards: model_settings(wildcards.model),
        variant=lambda wildcards: variant_settings(wildcards.variant, wildcards.model),
        batch_size=lambda wildcards: config["models"][wildcards.model].get(
            "batch_size", config["inference"]["batch_size"]
        ),
        part_size=config["inference"]["part_size"],
        max_error_share=config["inference"]["max_error_share"],
        condition=lambda wildcards: condition_settings(wildcards.condition),
    resources:
        gpu=model_resource("gpu", 0),
        mem_mb=model_resource("mem_mb", 4000),
        runtime=model_resource("runtime", 60),
        cpus_per_gpu=model_resource("cpus_per_gpu", 4),
    log:
        in_logs("calibrate_decision/{dataset}/{condition}/{model}/{variant}.log"),
    benchmark:
        in_benchmarks("calibrate_decision/{dataset}/{condition}/{model}/{variant}.tsv")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/calibrate_decision.py"


rule content_free_images:
    """The content-free images of contextual calibration: grey blank and the mean of the calibration images."""
    input:
        anno=HICO_ANNO,
        images=HICO_IMAGES,
    output:
        directory(CONTENT_FREE_IMAGES),
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: HICO_ROOT,
        identity=identity("hico_annotations", "hico_images"),
        images=DECISIONS["calibration_images"],
        seed=config["questions"]["seed"],
    log:
        in_logs("content_free_images/{dataset}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/content_free_images.py"
