"""Concatenate the metric parts into the long table ``results/metrics/metrics.parquet``."""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

import pandas as pd

from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import METRICS
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    parts = [read_table(path, METRICS) for path in snakemake.input]
    write_table(pd.concat(parts, ignore_index=True), snakemake.output[0], METRICS)
