rule report_pages:
    """The HTML report's own pages (src/verbmirage/workflow/report_pages.py): the landing page's headline, Table
    1's accuracies ours beside the paper's (report/workflow.rst includes it), and the run's facts: config, data
    roots, models, versions."""
    input:
        table1=PATHS.table(1, "parquet"),
    output:
        landing=PLAN.report_pages["landing"],
        facts=reported(PLAN.report_pages["run_facts"]),
    params:
        config=PLAN.config,  # the whole config as the run read it (a changed config writes the facts again)
        repository=workflow.basedir,  # the pipeline's checkout: its git commit
        variant_paper_names=PLAN.variant_paper_names,
        stand_ins=PLAN.stand_ins,
    log:
        PATHS.log("report_pages"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/report_pages.py"
