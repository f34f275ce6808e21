"""VCD divergence: KL = 0 shares, the KL distribution and flips against the plain variant; rule ``vcd_divergence``.

Inputs: the question tables and the prediction tables of ``params.runs`` (one dict per VCD run: model, variant,
condition, qset, plain_variant, plain_note, questions, predictions, plain: the counterpart's table or None).
Outputs: ``table`` (``io.VCD_DIVERGENCE``) and its HTML page, ``hist`` (``io.VCD_KL_HIST``) and ``figure`` (a PDF
and an SVG beside it), drawn from the two tables as written. Settings: ``params.bins`` (``analysis.vcd_divergence.bins``),
``params.paper_names`` (slug -> the paper's model name), ``params.notes`` (slug -> a note under the title).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.vcd_divergence import (
    divergence_report_table,
    draw_vcd_divergence_figure,
    vcd_divergence_tables,
)
from verbmirage.core.io import read_table, write_html, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS, VCD_DIVERGENCE, VCD_KL_HIST
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    p = snakemake.params
    questions = {path: read_table(path, QUESTIONS) for path in snakemake.input.questions}
    predictions = {path: read_table(path, PREDICTIONS) for path in snakemake.input.predictions}
    runs = [
        {**run, "questions": questions[run["questions"]], "where": run["predictions"],
         "predictions": predictions[run["predictions"]], "plain": predictions[run["plain"]] if run["plain"] else None}
        for run in p.runs
    ]
    summary, hist = vcd_divergence_tables(runs, p.bins, dict(p.paper_names))
    provenance = {"bins": p.bins, "runs": [{k: v for k, v in run.items() if k != "plain_note"} for run in p.runs]}
    write_table(summary, snakemake.output.table, VCD_DIVERGENCE, provenance=provenance)
    write_table(hist, snakemake.output.hist, VCD_KL_HIST, provenance=provenance)
    summary = read_table(snakemake.output.table, VCD_DIVERGENCE)
    title = "VCD divergence: KL = 0, one-token plausibility set, flips (ours beside the paper's)"
    write_html(divergence_report_table(summary), snakemake.output.html, title=title)
    draw_vcd_divergence_figure(summary, read_table(snakemake.output.hist, VCD_KL_HIST), snakemake.output.figure,
                               dict(p.notes))
