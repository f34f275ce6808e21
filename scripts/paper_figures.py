"""The paper's Figs. 1, 3, 4(b), 5, 6; rule ``paper_figures``.

Input: the long metrics table (and the package's copy of the paper's numbers, as for the tables).
Outputs: one PNG per figure (``params.figures``: fig1, fig3, fig4b, fig5, fig6 -> path), a PDF and an SVG
beside each (``output.prints``). Settings: ``params.models`` (bar-group order), ``params.paper_names`` (slug ->
paper model), ``params.model_entries`` (to note tiny random-weight models), ``params.variant`` (the bars),
``params.decoding`` (the bars' decoding), ``params.paper_variant`` (the marks), ``params.pair`` (Fig. 4(b)'s
conditions).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.paper_figures import draw_paper_figures, figure_note
from verbmirage.core.io import read_table
from verbmirage.core.schemas import METRICS
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers

with job_log(snakemake.log[0]) as log:
    p = snakemake.params
    metrics = read_table(snakemake.input.metrics, METRICS)
    paper = load_paper_numbers(packaged_paper_numbers())
    note = figure_note(p.model_entries, p.paper_names, p.variant, p.paper_variant, p.decoding)
    log.info("figures %s; note: %s", sorted(p.figures), note)
    draw_paper_figures(metrics, p.figures, paper, note=note, pair=tuple(p.pair or ("clean", "saltpepper")),
                       models=p.models, paper_names=p.paper_names, variant=p.variant, paper_variant=p.paper_variant,
                       decoding=p.decoding)
