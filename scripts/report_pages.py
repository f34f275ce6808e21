"""The HTML report's own pages: the landing page's headline (Table 1 at a glance) and the run's facts.

Input: ``table1`` (Table 1's Parquet). Outputs: ``landing`` (an HTML fragment that report/workflow.rst includes)
and ``facts`` (a page of its own in the report). Settings: ``params.config`` (the config as the run read it),
``params.repository`` (the pipeline's checkout), ``params.variant_paper_names``, ``params.stand_ins``.
The landing's first line names the data roots and models (from ``params.config``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.core.io import read_table
from verbmirage.core.paths import write_text
from verbmirage.core.joblog import job_log
from verbmirage.workflow.report_pages import landing_html, run_facts_html

with job_log(snakemake.log[0]):
    p = snakemake.params
    table1 = read_table(snakemake.input.table1)
    landing = landing_html(table1, p.variant_paper_names, p.stand_ins, config=p.config)
    write_text(snakemake.output.landing, landing)
    write_text(snakemake.output.facts, run_facts_html(p.config, p.repository, stand_ins=p.stand_ins))
