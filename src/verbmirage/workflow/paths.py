"""Every path the workflow reads or writes, spelled once.

Three kinds of paths:

- Fixed folders of the checkout, the same for every config: the demo data (``resources/demo/``), the
  downloads (``resources/data/``, ``resources/archives/``) and the tiny models (``resources/models/``).
- The files a dataset brings, inside the root its config names (:func:`hico_annotations`, ...).
- The artifacts, logs and benchmarks of one config's run, inside the folders
  :func:`verbmirage.workflow.run_folders.run_folders` chose for it (:class:`Paths`). Each is a template whose
  ``{fields}`` are the rules' wildcards (``{dataset}``, ``{qset}``, ``{condition}``, ``{model}``,
  ``{variant}``, ``{shard}``, ...): ``template.format(...)`` sets them all, :func:`fill` only some.

Nothing here reads the config: :class:`verbmirage.workflow.plan.Plan` decides which paths a run needs.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from verbmirage.workflow.run_folders import RunFolders

# ---- fixed folders ----------------------------------------------------------------------------------------
#: Where rule ``demo_hico`` writes the demo; a root pointing here need not exist yet.
DEMO_HICO_ROOT = "resources/demo/hico_20150920"
DEMO_HICO_DET_ROOT = "resources/demo/hico_20160224_det"
DEMO_CHARADES_ROOT = "resources/demo/charadesego"
DEMO_PANGEA_ROOT = "resources/demo/pangea/Data"  # rule demo_pangea (verbmirage.data.pangea)
#: Where rule ``fetch_dataset`` unpacks (or links) ``downloads.<name>``, and the flag it leaves when done.
DOWNLOADS_FOLDER = "resources/data"
DOWNLOADED = f"{DOWNLOADS_FOLDER}/{{download}}"
DOWNLOAD_DONE = f"{DOWNLOADS_FOLDER}/{{download}}.done"
#: Where a download's archive is kept while it is fetched (``downloads.<name>.archive``).
ARCHIVE = "resources/archives/{archive}"
#: Where the content versions and digests of data files are kept (:class:`verbmirage.data.identity.ContentVersions`).
CONTENT_CACHE = "resources/cache/contents"
#: Where rule ``tiny_model`` builds a tiny random-weight model of a transformers family.
TINY_MODEL = "resources/models/tiny_{family}"

#: What the demo rules write (rules demo_hico, demo_charadesego, demo_pangea).
DEMO_HICO_FILES = {
    "anno": f"{DEMO_HICO_ROOT}/anno.mat",
    "images": f"{DEMO_HICO_ROOT}/images",
    "bbox": f"{DEMO_HICO_DET_ROOT}/anno_bbox.mat",
}
DEMO_CHARADES_FILES = {
    "csv": f"{DEMO_CHARADES_ROOT}/CharadesEgo/CharadesEgo_v1_test.csv",
    "videos": f"{DEMO_CHARADES_ROOT}/CharadesEgo_v1_480",
}
DEMO_PANGEA_FILES = {  # the file names are datasets.pangea's defaults (schemas/config.schema.yaml)
    "samples": f"{DEMO_PANGEA_ROOT}/B123_train_KIN-FULL_with_node.pkl",
    "topology": f"{DEMO_PANGEA_ROOT}/verbnet_topology_898.pkl",
    "node_index": f"{DEMO_PANGEA_ROOT}/mapping_node_index.pkl",
    "label2node": f"{DEMO_PANGEA_ROOT}/Label2Node_batch1+2+3.json",
    "images": f"{DEMO_PANGEA_ROOT}/Images",
}


# ---- inside a dataset's root -------------------------------------------------------------------------------
def hico_annotations(root: str) -> str:
    """HICO's labels (``anno.mat``)."""
    return f"{root}/anno.mat"


def hico_images(root: str) -> str:
    """HICO's image folder (``images/{train,test}2015/``)."""
    return f"{root}/images"


def hico_det_boxes(det_root: str) -> str:
    """HICO-DET's boxes in their original form (``anno_bbox.mat``)."""
    return f"{det_root}/anno_bbox.mat"


def charades_annotations(root: str, split: str) -> str:
    """The CharadesEgo CSV of ``split``."""
    return f"{root}/CharadesEgo/CharadesEgo_v1_{split}.csv"


def charades_videos(root: str) -> str:
    """CharadesEgo's video folder when ``datasets.charadesego.videos`` does not name another."""
    return f"{root}/CharadesEgo_v1_480"


# ---- one config's artifacts, logs and benchmarks ------------------------------------------------------------
#: Log of each rule, inside the config's logs folder (merge and vote rules: one per group, the same template).
LOGS = {
    "job_server": "job_server.log",
    "report": "report.log",  # what `snakemake --report` said while verbmirage report wrote the report
    "run_summary": "run_summary.json",  # the last successful run's summary, printed again after its report
    "demo_hico": "demo_hico.log",
    "demo_charadesego": "demo_charadesego.log",
    "demo_pangea": "demo_pangea.log",
    "tiny_model": "tiny_model/{family}.log",
    "fetch_dataset": "fetch_dataset/{download}.log",
    "question_set": "question_set/{dataset}/{qset}.log",
    "train_stats": "train_stats/{dataset}.log",
    "question_counts": "question_counts/{dataset}.log",
    "image_tags": "image_tags.log",
    "charades_frames": "charades_frames.log",
    "charades_question_set": "charades_question_set/{qset}.log",
    "charades_train_stats": "charades_train_stats.log",
    "image_condition": "image_condition/{dataset}/{condition}.log",
    "derive_model": "derive_model/{model}.log",
    "training_questions": "training_questions/{model}.log",
    "predict_suite": "predict/{dataset}/{condition}/{model}/{variant}/{shard}.log",
    "merge_predictions": "merge_predictions/{dataset}/{condition}/{model}/{variant}.log",
    "ensemble": "ensemble/{dataset}/{condition}/{model}/{variant}.log",
    "calibration_question_set": "calibration_question_set/{dataset}/{qset}.log",
    "calibration_images": "calibration_images/{dataset}/{condition}.log",
    "calibrate_decision": "calibrate_decision/{dataset}/{condition}/{model}/{variant}.log",
    "content_free_images": "content_free_images/{dataset}.log",
    "metric_part": "metric_part/{dataset}/{condition}/{model}/{variant}.log",
    "consistency_part": "consistency_part/{dataset}/{reference}_vs_{other}/{model}/{variant}.log",
    "metrics": "metrics.log",
    "tables": "tables.log",
    "mitigation_tables": "mitigation_tables.log",
    "attention": "attention/{dataset}/{condition}/{model}.log",
    "attention_figures": "attention_figures.log",
    "vcd_divergence": "vcd_divergence.log",
    "known_object": "known_object.log",
    "known_object_figure": "known_object_figure.log",
    "uncertainty": "uncertainty.log",
    "uncertainty_figures": "uncertainty_figures.log",
    "fov": "fov.log",
    "fov_report": "fov_report.log",
    "object_reliance": "object_reliance.log",
    "reliance_report": "reliance_report.log",
    "paper_figures": "paper_figures.log",
    "report_pages": "report_pages.log",
}
#: Benchmark (time and memory) of each heavy rule, inside the config's benchmarks folder.
BENCHMARKS = {
    "derive_model": "derive_model/{model}.tsv",
    "predict_suite": "predict/{dataset}/{condition}/{model}/{variant}/{shard}.tsv",
    "calibrate_decision": "calibrate_decision/{dataset}/{condition}/{model}/{variant}.tsv",
    "attention": "attention/{dataset}/{condition}/{model}.tsv",
}
#: The paper's figures drawn by rule paper_figures (a figure whose data the config lacks is left out); Figs. 3
#: and 6 in parts, each at most a page tall (verbmirage.analysis.figure_layout).
PAPER_FIGURES = {
    "fig1": "figures/fig1_object_vs_verb.png",
    "fig3a": "figures/fig3a_rare_common.png",
    "fig3b": "figures/fig3b_rare_common.png",
    "fig4b": "figures/fig4b_error_consistency.png",
    "fig5": "figures/fig5_ego_exo.png",
    "fig6a": "figures/fig6a_ambiguity.png",
    "fig6b": "figures/fig6b_ambiguity.png",
    "fig6c": "figures/fig6c_ambiguity.png",
}
#: The three forms of every table: Parquet (the data), Markdown and HTML (for reading, the report).
TABLE_FORMATS = ("parquet", "md", "html")


def fill(template: str, **values) -> str:
    """``template`` with the named ``{fields}`` set and every other field left as it is (for Snakemake)."""
    parts = []
    for text, field, spec, conversion in string.Formatter().parse(template):
        parts.append(text.replace("{", "{{").replace("}", "}}"))
        if field is None:
            continue
        if field in values:
            parts.append(format(values[field], spec or ""))
        else:
            parts.append("{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
    return "".join(parts)


@dataclass(frozen=True)
class Paths:
    """The artifact, log and benchmark paths of one config's run (templates with the rules' wildcards)."""

    folders: RunFolders

    def result(self, path: str) -> str:
        """``path`` inside this config's results folder."""
        return f"{self.folders.results}/{path}"

    def log(self, rule: str, **values) -> str:
        """The log of ``rule`` (:data:`LOGS`) inside this config's logs folder; ``values`` set some fields."""
        return fill(f"{self.folders.logs}/{LOGS[rule]}", **values)

    def benchmark(self, rule: str) -> str:
        """The benchmark of ``rule`` (:data:`BENCHMARKS`) inside this config's benchmarks folder."""
        return f"{self.folders.benchmarks}/{BENCHMARKS[rule]}"

    # -- benchmark: question sets, image tags, training statistics
    @property
    def questions(self) -> str:
        return self.result("benchmark/{dataset}/{qset}.parquet")

    @property
    def train_stats(self) -> str:
        return self.result("benchmark/{dataset}/train_stats.parquet")

    def question_counts(self, ext: str) -> str:
        """Our question counts beside the paper's (``ext``: parquet, md or html)."""
        return self.result(f"benchmark/{{dataset}}/counts.{ext}")

    @property
    def image_tags(self) -> str:
        """Per HICO test image: its HICO-DET tags (ambiguity, single instance)."""
        return self.result("benchmark/hico/image_tags.parquet")

    @property
    def charades_frames(self) -> str:
        """The frames of the CharadesEgo pairs: ``frames/{exo,ego}/<pair>_<action>.jpg``."""
        return self.result("frames/charadesego")

    @property
    def charades_frame_table(self) -> str:
        return self.result("benchmark/charadesego/frames.parquet")

    # -- images under a condition
    @property
    def condition_images(self) -> str:
        """The images a dataset's questions ask about under one condition (and their manifest.parquet)."""
        return self.result("images/{dataset}/{condition}")

    # -- models
    @property
    def derived_model(self) -> str:
        """Where rule derive_model builds a derived model: Nullu's edited weights, a fine-tune's peft adapter."""
        return self.result("models/{model}")

    @property
    def training_questions(self) -> str:
        return self.result("training/{model}/questions.parquet")

    @property
    def training_sources(self) -> str:
        """Per Pangea source: kept or why not, and counts."""
        return self.result("training/{model}/sources.parquet")

    @property
    def training_summary(self) -> str:
        """Our counts and node coverage beside the paper's."""
        return self.result("training/{model}/summary.md")

    # -- inference
    @property
    def suite_shard(self) -> str:
        """One inference job's output (every set it asks on one image shard): a folder with ``<qset>.parquet``
        per set; its resumable parts, kept after success for reuse, live beside it in ``<shard>.parts/<qset>/``."""
        return self.result("shards/{dataset}/{condition}/{model}/{variant}/{shard}")

    @property
    def predictions(self) -> str:
        return self.result("predictions/{dataset}/{qset}/{condition}/{model}/{variant}.parquet")

    # -- calibrated decisions
    @property
    def calibration_questions(self) -> str:
        """A YN set's protocol on training images."""
        return self.result("benchmark/{dataset}/calibration/{qset}.parquet")

    @property
    def calibration_images(self) -> str:
        return self.result("images/calibration/{dataset}/{condition}")

    @property
    def calibration_answers(self) -> str:
        """A folder with ``<qset>.parquet`` per calibration set."""
        return self.result("calibration/{dataset}/{condition}/{model}/{variant}.answers")

    @property
    def calibration_cuts(self) -> str:
        """One cut per YN set."""
        return self.result("calibration/{dataset}/{condition}/{model}/{variant}.json")

    @property
    def content_free_images(self) -> str:
        """blank.png and mean.png (of HICO training images)."""
        return self.result("images/content_free/{dataset}")

    # -- metrics and tables
    @property
    def metric_part(self) -> str:
        """The metrics of one run (dataset, condition, model, variant) over every set it asks."""
        return self.result("metrics/parts/{dataset}/{condition}/{model}/{variant}.parquet")

    @property
    def consistency_part(self) -> str:
        """Error consistency of one (pair of conditions, model, variant) over every set both ask."""
        return self.result("metrics/parts/{dataset}/{reference}_vs_{other}/{model}/{variant}.parquet")

    def analysis_metric_part(self, analysis: str) -> str:
        """The metric rows an analysis adds to the metrics table (known_object, uncertainty, object_reliance)."""
        return self.result(f"metrics/parts/analysis/{analysis}.parquet")

    @property
    def metrics(self) -> str:
        return self.result("metrics/metrics.parquet")

    def table(self, number: int | str, ext: str) -> str:
        """Paper table ``number`` as ``ext`` (parquet, md, html)."""
        return self.result(f"tables/table{number}.{ext}")

    def tables(self, number: int | str) -> list[str]:
        """Paper table ``number`` in each of :data:`TABLE_FORMATS`."""
        return [self.table(number, ext) for ext in TABLE_FORMATS]

    def report_page(self, name: str) -> str:
        """One of the HTML report's own pages (``landing.html``, ``run_facts.html``)."""
        return self.result(f"report/{name}")

    def figure(self, name: str) -> str:
        """A figure's PNG (its PDF and SVG lie beside it)."""
        return self.result(f"figures/{name}.png")

    def analysis(self, name: str) -> str:
        """An analysis table (``name`` with its extension)."""
        return self.result(f"analysis/{name}")

    # -- analyses
    @property
    def attention_part(self) -> str:
        """One attention job: every set, the model loaded once."""
        return self.result("analysis/attention/{dataset}/{condition}/{model}.parquet")

    @property
    def known_object_ap(self) -> str:
        return self.result("metrics/ap_per_hoi.parquet")

    def fov_table(self, ext: str) -> str:
        return self.result(f"tables/fov.{ext}")

    def paper_figure(self, name: str) -> str:
        """One of :data:`PAPER_FIGURES`."""
        return self.result(PAPER_FIGURES[name])
