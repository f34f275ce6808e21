"""The attention table, its summary and Figs. 7, 8, 13, 14; rule ``attention_figures``.

Inputs: the per-job attention tables. Outputs: ``results/analysis/attention.parquet``, the summary
(``attention_summary.parquet`` and its HTML page) and one PNG per figure, a PDF and an SVG beside it (drawn
from that table only).
Settings: ``params.qsets`` (the table's set order), ``params.models`` (slug -> entry), ``params.roles`` (figure -> model), ``params.figures``
(figure -> path), ``params.condition``, ``params.bootstrap`` (the ``metrics:`` block: resamples, level, seed).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.attention import collect_attention
from verbmirage.analysis.attention_figures import draw_attention_figures
from verbmirage.analysis.attention_summary import summarize_attention
from verbmirage.core.io import read_table, write_html, write_table
from verbmirage.core.schemas import ATTENTION, ATTENTION_SUMMARY
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.metrics import BootstrapSettings

with job_log(snakemake.log[0]):
    p = snakemake.params
    collect_attention(snakemake.input.parts, snakemake.output.table, qsets=p.qsets)
    table = read_table(snakemake.output.table, ATTENTION)
    bootstrap = BootstrapSettings.from_config(p.bootstrap)
    summary = summarize_attention(table, bootstrap.resamples, bootstrap.level, bootstrap.seed)
    write_table(summary, snakemake.output.summary, ATTENTION_SUMMARY)
    write_html(summary, snakemake.output.summary_html, title="Attention: correct vs hallucinated answers (ours)")
    notes = {slug: "tiny model with RANDOM weights: the shares are noise, the figure only shows the layout"
             for slug, entry in p.models.items() if "tiny_" in str(entry.get("path", ""))}
    backends = {slug: entry["backend"] for slug, entry in p.models.items()}
    draw_attention_figures(table, p.figures, p.roles, notes, condition=p.condition, backends=backends)
