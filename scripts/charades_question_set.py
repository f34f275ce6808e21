"""One CharadesEgo question set (``wildcards.qset`` in yn_exo, yn_ego, mc_exo, mc_ego).

Input: the frame table. Output: the question table. Settings: ``params.root``
(class files), ``params.seed``, ``params.mc_options``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

import pandas as pd

from verbmirage.data.charades import load_vocabulary
from verbmirage.benchmark.charades_questions import build_charades_questions
from verbmirage.core.io import write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    frames = pd.read_parquet(snakemake.input.frames)
    frames = frames[frames.error.isna()]
    vocabulary = load_vocabulary(Path(snakemake.params.root) / "CharadesEgo")
    qset = snakemake.wildcards.qset
    questions = build_charades_questions(frames, vocabulary, qset, snakemake.params.seed, snakemake.params.mc_options)
    write_table(questions, snakemake.output[0], QUESTIONS, provenance={"qset": qset, "seed": snakemake.params.seed})
    log.info("%s: %d rows", qset, len(questions))
