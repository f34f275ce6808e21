rule tables:
    """Paper Tables 1-4 as Parquet, Markdown and HTML, from the long metrics table, beside the paper's rows."""
    input:
        METRICS,
    output:
        TABLES,
        [report(path, category="Paper tables", caption="../report/table.rst") for path in TABLES_HTML],
    params:
        models=MODELS,
        ensembles=ENSEMBLES,
        consistency_pairs=CONSISTENCY_PAIRS,
        partial_conditions=BOX_CONDITIONS,  # asked on single-instance images only: Table 2 narrows their pair
        variants=VARIANTS,
        paper_names=TABLE_PAPER_NAMES,  # slug -> the paper's model name (models.<slug>.paper_name)
        variant_paper_names={v: s.get("paper_name", "") for v, s in config["variants"].items()},
        planned=PLANNED_CELLS,  # a planned run without values keeps its row, with the reason
    log:
        in_logs("tables.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_tables.py"


rule mitigation_tables:
    """Paper Tables 5 (mitigation methods, with Appendix F's prompt suffix) and 8 (decoding strategies) as
    Parquet, Markdown and HTML, from the long metrics table, beside the paper's rows."""
    input:
        METRICS,
    output:
        table5=mitigation_table_outputs(5),
        table8=mitigation_table_outputs(8),
    params:
        models=MODELS + list(ENSEMBLES),
        paper_names=TABLE_PAPER_NAMES,  # slug -> the paper's model name (models.<slug>.paper_name)
        paper_methods=TABLE5_PAPER_METHODS,  # slug -> its Table 5 row (models.<slug>.paper_method)
        method_pairs=TABLE5_METHOD_PAIRS,  # slug -> the paper model its row is compared with (its base's)
        variant_paper_names=VARIANT_PAPER_NAMES,  # variant -> variants.<slug>.paper_name
        planned=PLANNED_CELLS,  # a planned run without values keeps its row, with the reason
    log:
        in_logs("mitigation_tables.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/mitigation_tables.py"
