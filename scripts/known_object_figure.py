"""Fig. 11 (ΔAP per HOI class, each model minus the reference CLIP entry); rule ``known_object_figure``.

Inputs: ``ap`` (``results/metrics/ap_per_hoi.parquet``) and ``metrics`` (the Known-Object mAP rows).
Output: one PNG (a PDF and an SVG beside it), drawn from those tables only. Settings: ``params.reference``, ``params.metric``,
``params.models`` (slug -> entry: backends for the paper's marks, tiny models noted as random).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.known_object import draw_known_object_figure
from verbmirage.core.io import read_table
from verbmirage.core.schemas import KNOWN_OBJECT_AP, METRICS
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    p = snakemake.params
    notes = {slug: "tiny model with RANDOM weights: its APs are noise, the figure only shows the layout"
             for slug, entry in p.models.items() if "tiny_" in str(entry.get("path", ""))}
    draw_known_object_figure(read_table(snakemake.input.ap, KNOWN_OBJECT_AP), read_table(snakemake.input.metrics, METRICS),
                             p.reference, snakemake.output[0], metric=p.metric, paper_names=p.paper_names,
                             notes=notes)
