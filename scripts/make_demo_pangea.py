"""Write the demo's mini Pangea (derived/pangea.py ``write_demo_pangea``).

Outputs: the samples pickle, topology, node index, Label2Node JSON and the Images folder of one root.
Settings: ``params.seed``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

from verbmirage.benchmark.pangea_training import write_demo_pangea
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    root = write_demo_pangea(Path(snakemake.output.samples).parent, seed=snakemake.params.seed)
    log.info("demo Pangea written: %s", root)
