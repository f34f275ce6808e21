"""The attention table and Figs. 7, 8, 13, 14; rule ``attention_figures``.

Inputs: the per-job attention tables. Outputs: ``results/analysis/attention.parquet`` and one PNG
per figure (drawn from that table only). Settings: ``params.models`` (slug -> entry),
``params.roles`` (figure -> model), ``params.figures`` (figure -> path), ``params.condition``.
"""

from verbmirage.analysis.attention import collect_attention
from verbmirage.analysis.attention_figures import draw_attention_figures
from verbmirage.io import ATTENTION, read_table
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]):
    p = snakemake.params
    collect_attention(snakemake.input.parts, snakemake.output.table)
    table = read_table(snakemake.output.table, ATTENTION)
    notes = {slug: "tiny model with RANDOM weights: the shares are noise, the figure only shows the layout"
             for slug, entry in p.models.items() if "tiny_" in str(entry.get("path", ""))}
    backends = {slug: entry["backend"] for slug, entry in p.models.items()}
    draw_attention_figures(table, p.figures, p.roles, notes, condition=p.condition, backends=backends)
