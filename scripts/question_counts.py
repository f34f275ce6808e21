"""Question counts per set beside the paper's (Appendix A).

Inputs: every question table (``questions``) and, for CharadesEgo, the frame table (``frames``: how each ego
frame's time was chosen). Outputs: ``parquet``, ``markdown`` and ``html`` (for the report).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.core.io import read_table, write_html, write_markdown, write_table
from verbmirage.core.schemas import QUESTION_COUNTS
from verbmirage.core.joblog import job_log
from verbmirage.benchmark.question_table import EGO_TIME_COLUMNS, question_counts

with job_log(snakemake.log[0]):
    frames = {}
    for path in snakemake.input.questions:
        frame = read_table(path)
        frames[frame.qset.iloc[0]] = frame
    dataset = snakemake.wildcards.dataset
    frame_table = read_table(snakemake.input.frames[0]) if snakemake.input.frames else None
    counts = question_counts(frames, dataset=dataset, frame_table=frame_table)
    write_table(counts, snakemake.output.parquet, QUESTION_COUNTS)
    titles = {
        "hico": "Question counts (ours vs paper, Appendix A). The paper's 47K (YN) and 16.6K (MC) stand beside "
                "each set of their kind: it does not say whether they count one set or both (docs/questions.md)",
        "charadesego": "CharadesEgo question counts (ours vs paper, Appendix A). The paper's 76K YN / 36K MC "
                       "unique questions (28K / 10K used in its experiments) count both views together; ours ask "
                       "each question in both views, one set per view. An ego set's frames are the middle of the "
                       "egocentric row's own interval of the action (ego_own_interval_share) or, where that row "
                       "does not annotate it, the exo time scaled by the length ratio (ego_scaled_exo_share; "
                       "docs/questions.md)",
    }
    title = titles.get(dataset, f"{dataset} question counts")
    shown = counts if frame_table is not None else counts.drop(columns=list(EGO_TIME_COLUMNS))  # empty for HICO
    write_markdown(shown, snakemake.output.markdown, title=title)
    write_html(shown, snakemake.output.html, title=title)
