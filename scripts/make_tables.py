"""Paper Tables 1-4 from the long metrics table (Parquet, Markdown, HTML; Table 4 with CharadesEgo).

Input: the metrics table. Outputs: ``results/tables/table{1,2,3}.{parquet,md,html}``.
Settings: ``params.models`` (row order), ``params.ensembles``, ``params.consistency_pairs``.
"""

from pathlib import Path

from verbmirage.io import read_table, write_html, write_markdown
from verbmirage.joblog import job_log
from verbmirage.tables import build_table, table1_columns, table2_columns, table3, table4_columns

TITLES = {
    1: "Table 1: YN and MC with and without object reference (clean images)",
    2: "Table 2: verb-only questions with and without image noise; error consistency",
    3: "Table 3: majority-vote ensembles vs their members",
    4: "Table 4: CharadesEgo, egocentric vs exocentric views of the same actions",
}

with job_log(snakemake.log[0]):
    metrics = read_table(snakemake.input[0])
    models = list(snakemake.params.models) + list(snakemake.params.ensembles)
    pairs = snakemake.params.consistency_pairs
    reference, distorted = pairs[0] if pairs else ("clean", "saltpepper")
    tables = {
        1: build_table(metrics, table1_columns(), models),
        2: build_table(metrics, table2_columns(reference, distorted), models),
        3: table3(metrics, snakemake.params.ensembles),
    }
    if "charadesego" in set(metrics.dataset):
        tables[4] = build_table(metrics, table4_columns(), models, dataset="charadesego")
    for number, table in tables.items():
        for path in snakemake.output:
            if Path(path).stem != f"table{number}":
                continue
            if path.endswith(".parquet"):
                table.to_parquet(path, index=False)
            elif path.endswith(".html"):
                write_html(table, path, title=TITLES[number])
            else:
                write_markdown(table, path, title=TITLES[number])
