rule paper_figures:
    """The paper's Figs. 1, 3, 4(b), 5 and 6 from the metrics table, with the paper's numbers marked.

    Draws from Parquet only (never runs a model); Fig. 5 needs CharadesEgo, Fig. 6 the HICO-DET tags.
    The paper's numbers are the package's copy of paper_tables.csv, as for the tables.
    """
    input:
        metrics=PATHS.metrics,
    output:
        [reported(path) for path in PLAN.paper_figures.values()],
        prints=figure_prints(*PLAN.paper_figures.values()),  # the same figures as PDF and SVG
    params:
        figures=PLAN.paper_figures,
        paper_names=PLAN.paper_names,  # slug -> the paper's model (models.<slug>.paper_name), as in the tables
        models=PLAN.models + list(PLAN.ensembles),
        model_entries=config["models"],
        variant=PLAN.variants[0],
        paper_variant=config["variants"][PLAN.variants[0]].get("paper_name") or "beam5",  # the paper's default decoding
        decoding=PLAN.paper_figure_decoding,  # the bars' decoding, named in the legend beside the marks'
        pair=PLAN.paper_figure_pair,
    log:
        PATHS.log("paper_figures"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/paper_figures.py"
