rule tables:
    """Paper Tables 1-3 as Parquet and Markdown, from the long metrics table."""
    input:
        METRICS,
    output:
        TABLES,
        [report(path, category="Paper tables", caption="../report/table.rst") for path in TABLES_HTML],
    params:
        models=MODELS,
        ensembles=ENSEMBLES,
        consistency_pairs=CONSISTENCY_PAIRS,
    log:
        "logs/tables.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_tables.py"
