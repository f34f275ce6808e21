# Calibrated decisions (variants.<slug>.decision; src/verbmirage/variants/decisions.py, docs/variants.md): the
# calibration sets and images (training split only), the threshold fit (a GPU job per run) and the
# content-free images. The prediction jobs of decision variants take these as `decision` input.


rule calibration_question_set:
    """One YN set's calibration questions: the benchmark's protocol on seeded training images (never test)."""
    input:
        anno=PLAN.data.hico_anno,
    output:
        PATHS.calibration_questions,
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: PLAN.data.hico_root,
        identity=identity("hico_annotations"),
        settings=config["questions"],
        images=PLAN.calibration.decisions["calibration_images"],
    log:
        PATHS.log("calibration_question_set"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/calibration_question_set.py"


rule calibration_images:
    """The calibration training images as a model sees them under one condition (+ manifest.parquet)."""
    input:
        source=PLAN.data.hico_images,
        questions=get_calibration_condition_tables,
    output:
        directory(PATHS.calibration_images),
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: PLAN.data.hico_root,
        identity=identity("hico_images"),
        settings=lambda wildcards: PLAN.condition_settings(wildcards.condition),
        seed=config["condition_seed"],
    log:
        PATHS.log("calibration_images"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_condition.py"


rule calibrate_decision:
    """A threshold variant's cuts for one run: the model answers its calibration sets (one job, resumable)."""
    priority: 5
    input:
        questions=get_calibration_tables,
        images=PATHS.calibration_images,
        train_stats=PATHS.train_stats,
        model_files=get_model_files,
    output:
        cuts=PATHS.calibration_cuts,
        answers=directory(PATHS.calibration_answers),
    wildcard_constraints:
        dataset="hico",
        model=alternatives(PLAN.models),
        variant=alternatives(PLAN.calibration.decisions["threshold"]),
    params:
        qsets=get_calibration_qsets,
        model=lambda wildcards: PLAN.model_settings(wildcards.model),
        variant=lambda wildcards: PLAN.run_variant_settings(wildcards.variant, wildcards.model),
        batch_size=lambda wildcards: PLAN.batch_size(wildcards.model),
        part_size=config["inference"]["part_size"],
        max_error_share=config["inference"]["max_error_share"],
        condition=lambda wildcards: PLAN.condition_settings(wildcards.condition),
    resources:
        gpu=model_resource("gpu", 0),
        mem_mb=model_resource("mem_mb", 4000),
        runtime=model_resource("runtime", 60),
        cpus_per_gpu=model_resource("cpus_per_gpu", 4),
    log:
        PATHS.log("calibrate_decision"),
    benchmark:
        PATHS.benchmark("calibrate_decision")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/calibrate_decision.py"


rule content_free_images:
    """The content-free images of contextual calibration: grey blank and the mean of the calibration images."""
    input:
        anno=PLAN.data.hico_anno,
        images=PLAN.data.hico_images,
    output:
        directory(PATHS.content_free_images),
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: PLAN.data.hico_root,
        identity=identity("hico_annotations", "hico_images"),
        images=PLAN.calibration.decisions["calibration_images"],
        seed=config["questions"]["seed"],
    log:
        PATHS.log("content_free_images"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/content_free_images.py"
