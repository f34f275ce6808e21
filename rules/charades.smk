rule charades_frames:
    """Middle frame of every action of the ego/exo pairs, in both views (PyAV)."""
    input:
        annotations=CHARADES_CSV,
        videos=CHARADES_VIDEOS,
    output:
        frames=directory(CHARADES_FRAMES),
        table=CHARADES_FRAME_TABLE,
    params:
        root=lambda wildcards: CHARADES_ROOT,
        videos=lambda wildcards: CHARADES_VIDEO_FOLDER,
        identity=identity("charadesego"),  # root, CharadesEgo/'s files' digests, the videos' listing
        split=CHARADES_SPLIT,
    log:
        in_logs("charades_frames.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/charades_frames.py"


rule charades_question_set:
    """yn_/mc_ x exo/ego: the same questions on both views of each action."""
    input:
        frames=CHARADES_FRAME_TABLE,
    output:
        CHARADES_QUESTIONS,
    wildcard_constraints:
        qset=_alternatives(CHARADES_QUESTION_SETS),
    params:
        root=lambda wildcards: CHARADES_ROOT,
        identity=identity("charadesego"),
        seed=config["questions"]["seed"],
        mc_options=config["questions"]["mc_options"],
    log:
        in_logs("charades_question_set/{qset}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/charades_question_set.py"


rule charades_train_stats:
    """Class frequencies of the CharadesEgo training split (the language prior's knowledge)."""
    input:
        annotations=CHARADES_CSV,
    output:
        CHARADES_TRAIN_STATS,
    params:
        root=lambda wildcards: CHARADES_ROOT,
        identity=identity("charadesego"),
    log:
        in_logs("charades_train_stats.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/charades_train_stats.py"
