"""The FOV table (full image beside each crop, percent) and Fig. 10; rule ``fov_report``.

Inputs: ``summary`` (``fov.parquet``) and ``rows`` (``fov_rows.parquet``). Outputs: ``results/tables/fov``
as Parquet, Markdown and HTML, and Fig. 10's pages ``figures`` (``fig10a_fov.png``, ...; a PDF and an SVG
beside each). Settings: ``params.models`` (with token probabilities, in order), ``params.qsets`` (the FOV
sets), ``params.skipped`` (without), ``params.notes`` (per-model figure notes), ``params.variants`` (model -> the
variant Fig. 10 shows), ``params.variant_entries`` (config ``variants``: how its decoding is named).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.fov import PAPER_NOTE, fov_report_table
from verbmirage.analysis.uncertainty_figures import draw_fov_figure
from verbmirage.core.io import read_table, write_html, write_markdown, write_parquet
from verbmirage.core.schemas import FOV, FOV_ROWS
from verbmirage.core.joblog import job_log

TITLE = "Field of view: full image vs crop on the same single-instance questions (percent)"

with job_log(snakemake.log[0]):
    p, out = snakemake.params, snakemake.output
    summary = read_table(snakemake.input.summary, FOV)
    rows = read_table(snakemake.input.rows, FOV_ROWS)
    table = fov_report_table(summary)
    write_parquet(table, out.table)
    write_markdown(table, out.markdown, title=f"{TITLE}. {PAPER_NOTE}")
    write_html(table, out.html, title=f"{TITLE}. {PAPER_NOTE}")
    draw_fov_figure(summary, rows, list(out.figures), list(p.models), list(p.qsets), p.notes,
                    skipped=list(p.skipped), variants=dict(p.variants), variant_entries=p.variant_entries)
