rule charades_frames:
    """Middle frame of every action of the ego/exo pairs, in both views (PyAV)."""
    input:
        annotations=PLAN.data.charades_csv,
        videos=PLAN.data.charades_videos,
    output:
        frames=directory(PATHS.charades_frames),
        table=PATHS.charades_frame_table,
    params:
        root=lambda wildcards: PLAN.data.charades_root,
        videos=lambda wildcards: PLAN.data.charades_video_folder,
        identity=identity("charadesego"),  # root, CharadesEgo/'s files' digests, the videos' listing
        split=PLAN.data.charades_split,
    log:
        PATHS.log("charades_frames"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/charades_frames.py"


rule charades_question_set:
    """yn_/mc_ x exo/ego: the same questions on both views of each action."""
    input:
        frames=PATHS.charades_frame_table,
    output:
        fill(PATHS.questions, dataset="charadesego"),
    wildcard_constraints:
        qset=alternatives(PLAN.dataset_qsets["charadesego"]),
    params:
        root=lambda wildcards: PLAN.data.charades_root,
        identity=identity("charadesego"),
        seed=config["questions"]["seed"],
        mc_options=config["questions"]["mc_options"],
    log:
        PATHS.log("charades_question_set"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/charades_question_set.py"


rule charades_train_stats:
    """Class frequencies of the CharadesEgo training split (the language prior's knowledge)."""
    input:
        annotations=PLAN.data.charades_csv,
    output:
        fill(PATHS.train_stats, dataset="charadesego"),
    params:
        root=lambda wildcards: PLAN.data.charades_root,
        identity=identity("charadesego"),
    log:
        PATHS.log("charades_train_stats"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/charades_train_stats.py"
