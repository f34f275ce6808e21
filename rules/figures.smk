rule paper_figures:
    """The paper's Figs. 1, 3, 4(b), 5 and 6 from the metrics table, with the paper's numbers marked when present.

    Draws from Parquet only (never runs a model); Fig. 5 needs CharadesEgo, Fig. 6 the HICO-DET tags.
    """
    input:
        metrics=METRICS,
        paper_numbers=PAPER_NUMBERS_INPUT,
    output:
        [
            report(path, category="Paper figures", caption=f"../report/{Path(path).stem}.rst")
            for path in PAPER_FIGURE_OUTPUTS
        ],
    params:
        figures=PAPER_FIGURES,
        paper_numbers_setting=PAPER_NUMBERS_SETTING,  # as configured: named in the note when the file is absent
        paper_names=PAPER_MODEL_NAMES,
        models=MODELS + list(ENSEMBLES),
        model_entries=config["models"],
        pair=PAPER_FIGURE_PAIR,
    log:
        "logs/paper_figures.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/paper_figures.py"
