"""The paper's Figs. 1, 3, 4(b), 5, 6; rule ``paper_figures``.

Input: the long metrics table (and the package's copy of the paper's numbers, as for the tables).
Outputs: one PNG per figure (``params.figures``: fig1, fig3a, fig3b, fig4b, fig5, fig6a-c -> path), a PDF and an SVG
beside each (``output.prints``). Settings: ``params.models`` (bar-group order), ``params.paper_names`` (slug ->
paper model), ``params.model_entries`` (to note tiny random-weight models), ``params.variants`` (figure -> model
-> the variant its bars draw; the marks are the paper's number for that decoding), ``params.variant_entries``
(config ``variants``: how the legends name each decoding), ``params.pair`` (Fig. 4(b)'s conditions),
``params.image_free`` (the models that never look at the image: Fig. 4(b) marks them).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.paper_figures import draw_paper_figures, drawn_runs
from verbmirage.core.io import read_table
from verbmirage.core.schemas import METRICS
from verbmirage.core.joblog import job_log
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers

with job_log(snakemake.log[0]) as log:
    p = snakemake.params
    metrics = read_table(snakemake.input.metrics, METRICS)
    paper = load_paper_numbers(packaged_paper_numbers())
    drawn = {figure: drawn_runs(variants, p.variant_entries) for figure, variants in p.variants.items()}
    notes = draw_paper_figures(metrics, p.figures, paper, pair=tuple(p.pair or ("clean", "saltpepper")), drawn=drawn,
                               model_entries=p.model_entries, models=p.models, paper_names=p.paper_names,
                               image_free=list(p.image_free))
    for name, note in notes.items():
        log.info("%s (variants drawn: %s); note: %s", name, dict(p.variants[name]), note)
