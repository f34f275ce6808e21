"""Training-split label frequencies for the language-prior baseline.

Input: ``anno``. Output: a table (kind, verb, object, positives, total, p_yes).
"""

from verbmirage.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.jobserver)

from verbmirage.hico import load_hico
from verbmirage.joblog import job_log
from verbmirage.models.baselines import training_frequencies

with job_log(snakemake.log[0]):
    training_frequencies(load_hico(snakemake.params.root)).to_parquet(snakemake.output[0], index=False)
