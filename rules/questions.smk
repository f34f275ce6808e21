rule question_set:
    """One HICO question set; reads annotations only, never images."""
    priority: 20
    input:
        anno=PLAN.data.hico_anno,
    output:
        PATHS.questions,
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: PLAN.data.hico_root,  # the dataset folder (its files may come from a download)
        identity=identity("hico_annotations"),  # root and anno.mat's digest: replaced data reruns the job
        settings=config["questions"],
    log:
        PATHS.log("question_set"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/build_question_set.py"


rule train_stats:
    """Training-split label frequencies (the language-prior baseline's knowledge)."""
    input:
        anno=PLAN.data.hico_anno,
    output:
        PATHS.train_stats,
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: PLAN.data.hico_root,  # the dataset folder (its files may come from a download)
        identity=identity("hico_annotations"),
    log:
        PATHS.log("train_stats"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/train_stats.py"


rule question_counts:
    """Our question counts beside the paper's (HICO, and CharadesEgo when configured, with the share of ego frames
    taken from the egocentric row's own interval vs the scaled exo time)."""
    input:
        questions=get_dataset_questions,
        frames=get_frame_tables,
    output:
        parquet=PATHS.question_counts("parquet"),
        markdown=PATHS.question_counts("md"),
        html=reported(PATHS.question_counts("html")),
    log:
        PATHS.log("question_counts"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/question_counts.py"
