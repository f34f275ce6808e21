"""Paper Tables 6 and 7 (ours beside the paper's) and Fig. 15; rule ``reliance_report``.

Inputs: ``metrics`` (the long metrics table: the overlap-index and IoU rows, and the YN accuracies
Fig. 15 prints), ``objects`` (object_reliance.parquet), ``verbs`` (verb_influence.parquet).
Outputs: ``table6``/``table7`` (Parquet, Markdown, HTML) and ``figure`` (Fig. 15 PNG; a PDF and an SVG beside it), drawn from these tables only.
Settings: ``params.models``, ``params.figure_model``, ``params.condition``, ``params.variant``,
``params.min_questions``, ``params.notes`` (model -> a line printed under the figure title).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.analysis.object_reliance import (
    draw_fig15,
    iou_matrix,
    overall_accuracy,
    table6,
    table7,
    table_pages,
)
from verbmirage.core.io import read_table, write_table
from verbmirage.core.paths import write_text
from verbmirage.core.schemas import METRICS, OBJECT_RELIANCE, RELIANCE_TABLE6, RELIANCE_TABLE7, VERB_INFLUENCE
from verbmirage.core.joblog import job_log

TITLES = {
    6: "Table 6: influential object set overlap, |S1 ∩ S2| / min(|S1|, |S2|) (percent)",
    7: "Table 7: YN influenced verb set IoU between models (percent)",
}

with job_log(snakemake.log[0]):
    p, out = snakemake.params, snakemake.output
    metrics = read_table(snakemake.input.metrics, METRICS)
    objects = read_table(snakemake.input.objects, OBJECT_RELIANCE)
    verbs = read_table(snakemake.input.verbs, VERB_INFLUENCE)
    keys = {"dataset": "hico", "condition": p.condition, "variant": p.variant}
    t6, t7 = table6(metrics, objects, p.models, keys), table7(metrics, verbs, p.models, keys)
    write_table(t6, out.table6[0], RELIANCE_TABLE6)
    write_table(t7, out.table7[0], RELIANCE_TABLE7)
    pages = {
        6: table_pages([("ours and the paper's", t6)], TITLES[6]),
        7: table_pages([("model pairs, ours and the paper's", t7), ("ours", iou_matrix(t7, "measured")),
                        ("paper", iou_matrix(t7, "paper"))], TITLES[7]),
    }
    for number, paths in ((6, out.table6), (7, out.table7)):
        markdown, html = pages[number]
        write_text(paths[1], markdown)
        write_text(paths[2], html)
    draw_fig15(objects, p.figure_model, out.figure, overall=overall_accuracy(metrics, p.figure_model, keys),
               note=p.notes.get(p.figure_model, ""), min_questions=p.min_questions, variant=p.variant)
