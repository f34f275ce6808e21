rule tables:
    """Paper Tables 1-4 as Parquet, Markdown and HTML, from the long metrics table, beside the paper's rows."""
    input:
        PATHS.metrics,
    output:
        PLAN.tables,
        [reported(path) for path in PLAN.tables_html],
    params:
        models=PLAN.models,
        ensembles=PLAN.ensembles,
        consistency_pairs=PLAN.consistency_pairs,
        partial_conditions=PLAN.box_conditions,  # asked on single-instance images only: Table 2 narrows their pair
        variants=PLAN.variants,
        paper_names=PLAN.paper_names,  # slug -> the paper's model name (models.<slug>.paper_name)
        variant_paper_names=PLAN.variant_paper_names,
        planned=PLAN.planned_cells,  # a planned run without values keeps its row, with the reason
        stand_ins=PLAN.stand_ins,  # model -> why its rows are not a model's result (models.<slug>.stand_in)
    log:
        PATHS.log("tables"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_tables.py"


rule mitigation_tables:
    """Paper Tables 5 (mitigation methods, with Appendix F's prompt suffix) and 8 (decoding strategies) as
    Parquet, Markdown and HTML, from the long metrics table, beside the paper's rows."""
    input:
        PATHS.metrics,
    output:  # Parquet, Markdown and HTML; the HTML in the report with its own caption
        table5=[*PATHS.tables(5)[:2], reported(PATHS.table(5, "html"))],
        table8=[*PATHS.tables(8)[:2], reported(PATHS.table(8, "html"))],
    params:
        models=PLAN.models + list(PLAN.ensembles),
        paper_names=PLAN.paper_names,  # slug -> the paper's model name (models.<slug>.paper_name)
        paper_methods=PLAN.paper_methods,  # slug -> its Table 5 row (models.<slug>.paper_method)
        method_pairs=PLAN.method_pairs,  # slug -> the paper model its row is compared with (its base's)
        variant_paper_names=PLAN.variant_paper_names,  # variant -> variants.<slug>.paper_name
        planned=PLAN.planned_cells,  # a planned run without values keeps its row, with the reason
        stand_ins=PLAN.stand_ins,  # model -> why its rows are not a model's result (models.<slug>.stand_in)
    log:
        PATHS.log("mitigation_tables"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/mitigation_tables.py"
