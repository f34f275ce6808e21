"""Known-Object AP per HOI and mAP rows; rule ``known_object``.

Inputs: ``questions`` (the ``analysis.known_object.qset`` table), ``predictions`` (one table per
configured condition x model x variant), ``boxes`` (HICO-DET, for its rare HOIs; optional),
``images`` (folders of partial conditions such as crop; optional).
Outputs: ``ap`` (``results/metrics/ap_per_hoi.parquet``) and ``metrics`` (a METRICS part: map and
map_voc11 for all / rare / non_rare). Settings: ``params.runs`` ("condition/model/variant" -> predictions),
``params.settings`` (analysis.known_object, checked), ``params.det_root``, ``params.images``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.known_object import known_object_job
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    p = snakemake.params
    known_object_job(
        snakemake.input.questions, p.runs, snakemake.output.ap, snakemake.output.metrics, p.settings,
        images_dirs=p.images, det_root=p.det_root or None,
    )
