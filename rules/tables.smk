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
        variants=VARIANTS,
        paper_names=TABLE_PAPER_NAMES,  # slug -> the paper's model name (models.<slug>.paper_name)
        variant_paper_names={v: s.get("paper_name", "") for v, s in config["variants"].items()},
    log:
        "logs/tables.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_tables.py"
