"""Training-split label frequencies for the language-prior baseline.

Input: ``anno``. Output: a table (kind, verb, object, positives, total, p_yes).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.core.io import write_parquet
from verbmirage.data.hico import load_hico
from verbmirage.core.joblog import job_log
from verbmirage.models.baselines import training_frequencies

with job_log(snakemake.log[0]):
    write_parquet(training_frequencies(load_hico(snakemake.params.root)), snakemake.output[0])
