rule paper_figures:
    """The paper's Figs. 1, 3, 4(b), 5 and 6 from the metrics table, with the paper's numbers marked.

    Draws from Parquet only (never runs a model); Fig. 5 needs CharadesEgo, Fig. 6 the HICO-DET tags.
    The paper's numbers are the package's copy of paper_tables.csv, as for the tables.
    """
    input:
        metrics=PATHS.metrics,
    output:
        [reported(path) for path in PLAN.figures.files.values()],
        prints=figure_prints(*PLAN.figures.files.values()),  # the same figures as PDF and SVG
    params:
        figures=PLAN.figures.files,
        paper_names=PLAN.paper_names,  # slug -> the paper's model (models.<slug>.paper_name), as in the tables
        models=PLAN.models + list(PLAN.ensembles),
        model_entries=config["models"],
        variants=PLAN.figures.variants,  # figure -> model -> the variant its bars draw (analysis.figures)
        variant_entries=config["variants"],  # how the legends name each decoding, and the marks' decoding
        pair=PLAN.figures.pair,
        image_free=PLAN.image_free_models,  # blind baselines and the oracle: kappa 100 by construction (Fig. 4(b))
    log:
        PATHS.log("paper_figures"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/paper_figures.py"
