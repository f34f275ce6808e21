rule paper_figures:
    """The paper's Figs. 1, 3, 4(b), 5 and 6 from the metrics table, with the paper's numbers marked.

    Draws from Parquet only (never runs a model); Fig. 5 needs CharadesEgo, Fig. 6 the HICO-DET tags.
    The paper's numbers are the package's copy of paper_tables.csv, as for the tables.
    """
    input:
        metrics=METRICS,
    output:
        [
            report(path, category="Paper figures", caption=f"../report/{Path(path).stem}.rst")
            for path in PAPER_FIGURE_OUTPUTS
        ],
        prints=figure_prints(*PAPER_FIGURE_OUTPUTS),  # the same figures as PDF and SVG
    params:
        figures=PAPER_FIGURES,
        paper_names=TABLE_PAPER_NAMES,  # slug -> the paper's model (models.<slug>.paper_name), as in the tables
        models=MODELS + list(ENSEMBLES),
        model_entries=config["models"],
        variant=VARIANTS[0],
        paper_variant=config["variants"][VARIANTS[0]].get("paper_name") or "beam5",  # the paper's default decoding
        decoding=PAPER_FIGURE_DECODING,  # the bars' decoding, named in the legend beside the marks'
        pair=PAPER_FIGURE_PAIR,
    log:
        in_logs("paper_figures.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/paper_figures.py"
