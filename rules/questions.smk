rule question_set:
    """One HICO question set; reads annotations only, never images."""
    priority: 20
    input:
        anno=HICO_ANNO,
    output:
        QUESTIONS,
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: HICO_ROOT,  # the dataset folder (its files may come from a download)
        identity=identity("hico_annotations"),  # root and anno.mat's digest: replaced data reruns the job
        settings=config["questions"],
    log:
        in_logs("question_set/{dataset}/{qset}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/build_question_set.py"


rule train_stats:
    """Training-split label frequencies (the language-prior baseline's knowledge)."""
    input:
        anno=HICO_ANNO,
    output:
        TRAIN_STATS,
    wildcard_constraints:
        dataset="hico",
    params:
        root=lambda wildcards: HICO_ROOT,  # the dataset folder (its files may come from a download)
        identity=identity("hico_annotations"),
    log:
        in_logs("train_stats/{dataset}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/train_stats.py"


rule question_counts:
    """Our question counts beside the paper's (HICO, and CharadesEgo when configured)."""
    input:
        lambda wildcards: expand(QUESTIONS, dataset=wildcards.dataset, qset=DATASET_QSETS[wildcards.dataset]),
    output:
        parquet=QUESTION_COUNT_FILES["parquet"],
        markdown=QUESTION_COUNT_FILES["md"],
    log:
        in_logs("question_counts/{dataset}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/question_counts.py"
