"""Write the demo CharadesEgo (annotations and paired videos). Settings: ``params.pairs``, ``params.seed``."""

from verbmirage.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.jobserver)

from pathlib import Path

from verbmirage.charades import write_demo_charadesego
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]):
    write_demo_charadesego(Path(snakemake.output.csv).parents[1], snakemake.params.pairs, snakemake.params.seed)
