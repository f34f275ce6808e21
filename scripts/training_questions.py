"""Build a Pangea fine-tune's training questions and check them against HICO's test images.

Inputs: Pangea's pickles and images (``params.pangea``: root and file names), HICO (``params.hico_root``).
Outputs: ``questions`` (io.QUESTIONS), ``sources`` (io.PANGEA_SOURCES), ``summary`` (Markdown, beside the
paper's numbers). Settings: ``params.settings`` (the entry's ``derive.pangea`` block).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.benchmark.pangea_training import write_training_questions
from verbmirage.benchmark.pangea_settings import TrainingQuestionSettings
from verbmirage.data.pangea import PangeaFiles
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    pangea = dict(snakemake.params.pangea)
    settings = TrainingQuestionSettings.from_config(dict(snakemake.params.settings))
    built = write_training_questions(pangea["root"], PangeaFiles.from_config(pangea), settings,
                                     snakemake.params.hico_root, snakemake.output.questions,
                                     snakemake.output.sources, snakemake.output.summary)
    log.info("%d training questions from %d images; %d of %d selected nodes covered", len(built.questions),
             len(built.used_images), built.nodes_covered, built.nodes_selected)
