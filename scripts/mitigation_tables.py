"""Paper Tables 5 and 8 from the long metrics table, each beside the paper's published rows; rule ``mitigation_tables``.

Input: the metrics table. Outputs: ``table5`` and ``table8`` (Parquet, Markdown, HTML): the Parquet holds our
rows (``source`` measured, with 95% intervals) and every row the paper published for the table (``source``
paper; Table 5 also Appendix F's prompt-suffix rows); Markdown and HTML lay them side by side with the
difference where names match (verbmirage.evaluation.mitigation_tables says which runs land in which row).
Settings: ``params.models`` (row order), ``params.paper_names`` (slug -> the paper's model name),
``params.paper_methods`` (slug -> its Table 5 row), ``params.method_pairs`` (slug -> the paper model its
Table 5 row is compared with), ``params.variant_paper_names``, ``params.planned`` (the cells of every planned
run: a run without values keeps its row, with the reason).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.core.io import read_table, write_html, write_markdown, write_table
from verbmirage.core.schemas import DECODING_TABLE8, METRICS, MITIGATION_TABLE5
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.mitigation_tables import table5, table8
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers

TITLES = {
    5: "Table 5: mitigation methods on LLaVA-1.5-7B (the paper's baseline 'none' = beam search), and Appendix F's "
       "prompt suffix",
    8: "Table 8: decoding strategies, sampling vs sampling+VCD vs beam search",
}

with job_log(snakemake.log[0]):
    p, out = snakemake.params, snakemake.output
    metrics = read_table(snakemake.input[0], METRICS)
    paper = load_paper_numbers(packaged_paper_numbers())
    tables = {
        5: (table5(metrics, paper, p.models, p.variant_paper_names, p.paper_names, p.paper_methods,
                   method_pairs=p.method_pairs, planned=p.planned, stand_ins=p.stand_ins),
            out.table5, MITIGATION_TABLE5),
        8: (table8(metrics, paper, p.models, p.variant_paper_names, p.paper_names, planned=p.planned,
                   stand_ins=p.stand_ins), out.table8,
            DECODING_TABLE8),
    }
    for number, (table, (parquet, markdown, html), schema) in tables.items():
        write_table(table.frame, parquet, schema)
        display = table.display(p.variant_paper_names)
        write_markdown(display, markdown, title=TITLES[number])
        write_html(display, html, title=TITLES[number])
