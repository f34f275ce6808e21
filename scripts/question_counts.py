"""Question counts per set beside the paper's (Appendix A).

Inputs: every question table. Outputs: ``parquet``, ``markdown`` and ``html`` (for the report).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.core.io import read_table, write_html, write_markdown, write_table
from verbmirage.core.schemas import QUESTION_COUNTS
from verbmirage.core.joblog import job_log
from verbmirage.benchmark.question_table import question_counts

with job_log(snakemake.log[0]):
    frames = {}
    for path in snakemake.input:
        frame = read_table(path)
        frames[frame.qset.iloc[0]] = frame
    dataset = snakemake.wildcards.dataset
    counts = question_counts(frames, dataset=dataset)
    write_table(counts, snakemake.output.parquet, QUESTION_COUNTS)
    titles = {
        "hico": "Question counts (ours vs paper, Appendix A). The paper's 47K (YN) and 16.6K (MC) stand beside "
                "each set of their kind: it does not say whether they count one set or both (docs/questions.md)",
        "charadesego": "CharadesEgo question counts (ours vs paper, Appendix A). The paper's 76K YN / 36K MC "
                       "unique questions (28K / 10K used in its experiments) count both views together; ours ask "
                       "each question in both views, one set per view (docs/questions.md)",
    }
    title = titles.get(dataset, f"{dataset} question counts")
    write_markdown(counts, snakemake.output.markdown, title=title)
    write_html(counts, snakemake.output.html, title=title)
