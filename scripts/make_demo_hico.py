"""Write the demo HICO / HICO-DET.

Outputs: ``anno`` (anno.mat), ``images`` (folder), ``bbox`` (anno_bbox.mat).
Settings: ``params.demo`` (train_images, test_images, seed).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

from verbmirage.data.demo import DemoSizes, write_demo_hico
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    demo = snakemake.params.demo
    sizes = DemoSizes(train=demo["train_images"], test=demo["test_images"], seed=demo["seed"])
    write_demo_hico(Path(snakemake.output.anno).parent, Path(snakemake.output.bbox).parent, sizes)
    log.info("demo HICO written: %s", sizes)
