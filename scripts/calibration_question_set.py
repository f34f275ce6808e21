"""Build the calibration questions of one HICO YN set: the benchmark's protocol on seeded training images.

Input: ``anno``. Output: the question table (schema ``verbmirage.benchmark.question_table.QUESTIONS``), training images only.
Settings: ``params.settings`` (config key ``questions``: protocol and seed), ``params.images`` (how many
training images: ``variants.<slug>.decision.calibration_images``); wildcard ``qset``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.benchmark.calibration import build_calibration_set
from verbmirage.data.hico import load_hico
from verbmirage.core.io import write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.joblog import job_log
from verbmirage.benchmark.questions import QuestionSettings

with job_log(snakemake.log[0]) as log:
    settings = QuestionSettings.from_config(snakemake.params.settings)
    qset = snakemake.wildcards.qset
    questions = build_calibration_set(load_hico(snakemake.params.root), qset, settings, snakemake.params.images)
    write_table(questions, snakemake.output[0], QUESTIONS,
                provenance={"qset": qset, "split": "train", "images": snakemake.params.images,
                            "settings": vars(settings)})
    log.info("%s calibration: %d rows on %d training images, %d yes", qset, len(questions),
             questions.image.nunique(), (questions.answer == "yes").sum())
