"""Class frequencies of the CharadesEgo training split for the language prior.

Input: the annotations (class files and ``CharadesEgo_v1_train.csv``). Output: the statistics table.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

from verbmirage.core.io import write_parquet
from verbmirage.data.charades import load_split, load_vocabulary
from verbmirage.benchmark.charades_questions import training_frequencies
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    annotations = Path(snakemake.params.root) / "CharadesEgo"
    write_parquet(training_frequencies(load_split(annotations, "train"), load_vocabulary(annotations)),
                  snakemake.output[0])
