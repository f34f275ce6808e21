"""The content-free images of contextual calibration: a uniform grey ``blank.png`` and ``mean.png``, the
per-pixel mean of the seeded calibration training images, both of their median size (+ content_free.json).

Inputs: ``anno``, ``images`` (the HICO image folder, or what produces it). Output: the folder.
Settings: ``params.root`` (the HICO folder), ``params.images`` (how many: ``decision.calibration_images``),
``params.seed`` (``questions.seed``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.benchmark.calibration import write_content_free_images
from verbmirage.data.hico import load_hico
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    p = snakemake.params
    note = write_content_free_images(p.root, load_hico(p.root), p.images, p.seed, snakemake.output[0])
    log.info("blank and mean of %d training images, %d x %d", note["mean_of"], *note["size"])
