"""Write the demo CharadesEgo (annotations and paired videos). Settings: ``params.pairs``, ``params.seed``."""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

from verbmirage.data.charades import write_demo_charadesego
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    write_demo_charadesego(Path(snakemake.output.csv).parents[1], snakemake.params.pairs, snakemake.params.seed)
