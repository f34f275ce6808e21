"""Paper Tables 1-4 from the long metrics table, each beside the paper's published rows (Table 4 with CharadesEgo).

Input: the metrics table. Outputs: ``results/tables/table{1,2,3,4}.{parquet,md,html}``: the Parquet holds
our rows (``source`` measured, with 95% intervals) and every row the paper published for the table
(``source`` paper); Markdown and HTML lay them side by side with the difference where names match.
Settings: ``params.models`` (row order), ``params.ensembles``, ``params.consistency_pairs``,
``params.variants``, ``params.paper_names`` (slug -> the paper's model name), ``params.variant_paper_names``,
``params.planned`` (the cells of every planned run: a run without values keeps its row, with the reason),
``params.stand_ins`` (model -> why its rows are not a model's result: noted on its rows).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

from verbmirage.core.io import read_table, write_html, write_markdown, write_parquet
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers
from verbmirage.evaluation.tables import paper_tables

TITLES = {
    1: "Table 1: YN and MC with and without object reference (clean images)",
    2: "Table 2: verb-only questions under two image conditions; error consistency (kappa x100)",
    3: "Table 3: majority-vote ensembles vs their members",
    4: "Table 4: CharadesEgo, egocentric vs exocentric views of the same actions",
}

with job_log(snakemake.log[0]):
    p = snakemake.params
    metrics = read_table(snakemake.input[0])
    tables = paper_tables(metrics, load_paper_numbers(packaged_paper_numbers()), p.models, p.ensembles,
                          [tuple(pair) for pair in p.consistency_pairs], p.variants, p.paper_names,
                          partial_conditions=p.partial_conditions, planned=p.planned, stand_ins=p.stand_ins)
    for number, table in tables.items():
        display = table.display(p.variant_paper_names)
        for path in snakemake.output:
            if Path(path).stem != f"table{number}":
                continue
            if path.endswith(".parquet"):
                write_parquet(table.frame, path)
            elif path.endswith(".html"):
                write_html(display, path, title=TITLES[number])
            else:
                write_markdown(display, path, title=TITLES[number])
