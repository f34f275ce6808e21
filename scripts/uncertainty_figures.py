"""Figs. 9 and 12 (token uncertainty) from the histogram table; rule ``uncertainty_figures``.

Input: ``uncertainty_hist.parquet``. Outputs: one PNG per figure, a PDF and an SVG beside it. Settings: ``params.figures``
(number -> path), ``params.models`` (those with token probabilities, in order), ``params.skipped``
(those without, named under the titles), ``params.backends``, ``params.notes``, ``params.variants`` (model ->
the variant drawn), ``params.variant_entries`` (config ``variants``), ``params.condition``, ``params.chosen``
(figure number -> the model it shows instead of its role's: ``analysis.uncertainty.figures``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.uncertainty_figures import draw_uncertainty_figures
from verbmirage.core.io import read_table
from verbmirage.core.schemas import UNCERTAINTY_HIST
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    p = snakemake.params
    hist = read_table(snakemake.input[0], UNCERTAINTY_HIST)
    roles = draw_uncertainty_figures(hist, p.figures, list(p.models), p.backends, p.notes, skipped=list(p.skipped),
                                     variants=dict(p.variants), condition=p.condition,
                                     variant_entries=p.variant_entries, chosen=dict(p.chosen))
    log.info("figure roles: %s", roles)
