"""Build one HICO question set from ``anno.mat``.

Input: ``anno``. Output: the question table (schema ``verbmirage.benchmark.question_table.QUESTIONS``).
Settings: ``params.settings`` (config key ``questions``); wildcard ``qset``. The job's ``threads`` (1 unless a
profile sets more, e.g. ``set-threads: question_set=4``) split the images over forked workers.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.data.hico import load_hico
from verbmirage.core.io import write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.joblog import job_log
from verbmirage.benchmark.questions import QuestionSettings, build_question_set

with job_log(snakemake.log[0]) as log:
    settings = QuestionSettings.from_config(snakemake.params.settings)
    qset = snakemake.wildcards.qset
    questions = build_question_set(load_hico(snakemake.params.root), qset, settings, workers=snakemake.threads)
    write_table(questions, snakemake.output[0], QUESTIONS, provenance={"qset": qset, "settings": vars(settings)})
    log.info("%s: %d rows", qset, len(questions))
