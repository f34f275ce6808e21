"""The paper's Figs. 1, 3, 4(b), 5, 6; rule ``paper_figures``.

Inputs: the long metrics table and, when the file exists, the paper's numbers (``paper_tables.csv``).
Outputs: one PNG per figure (``params.figures``: fig1, fig3, fig4b, fig5, fig6 -> path).
Settings: ``params.models`` (bar-group order), ``params.paper_names`` (slug -> paper model),
``params.model_entries`` (to note tiny random-weight models), ``params.pair`` (Fig. 4(b)'s conditions).
"""

from verbmirage.analysis.paper_figures import draw_paper_figures, figure_note
from verbmirage.io import METRICS, read_table
from verbmirage.joblog import job_log
from verbmirage.paper_numbers import load_paper_numbers

with job_log(snakemake.log[0]) as log:
    p = snakemake.params
    metrics = read_table(snakemake.input.metrics, METRICS)
    given = snakemake.input.get("paper_numbers", [])  # an input only when the file exists
    paper = load_paper_numbers(given if isinstance(given, str) else next(iter(given), ""))
    note = figure_note(p.model_entries, p.paper_names, p.paper_numbers_setting, paper_found=not paper.empty)
    log.info("figures %s; note: %s", sorted(p.figures), note)
    draw_paper_figures(metrics, p.figures, paper, note=note, pair=tuple(p.pair or ("clean", "saltpepper")),
                       models=p.models, paper_names=p.paper_names)
