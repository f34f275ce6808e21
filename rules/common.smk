# All the Python of the workflow: config validation, wildcard constraints,
# artifact paths and input functions. Rule files hold rules only.

import os
import sys
from pathlib import Path

from snakemake.utils import validate

# The package lives in src/; import it here even when it is not pip-installed.
# Scripts find it the same way through the scripts/verbmirage link (Snakemake
# puts a script's folder on its sys.path), so conda and cluster jobs work too.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from verbmirage.data.charades import CHARADES_QUESTION_SETS
from verbmirage.benchmark.conditions import CONDITIONS as CONDITION_TYPES
from verbmirage.data.hico import hico_det_file
from verbmirage.benchmark.conditions import image_settings
from verbmirage.workflow.config import (
    DEMO_CHARADES_ROOT,
    DEMO_HICO_DET_ROOT,
    DEMO_HICO_ROOT,
    DEMO_PANGEA_ROOT,
    DOWNLOADS_FOLDER,
    check_config,
    check_schema,
    check_yaml_file,
    condition_question_sets,
)
from verbmirage.models.entries import model_question_sets, model_variant_list
from verbmirage.models.registry import PLANNING_KEYS as MODEL_PLANNING_KEYS
from verbmirage.evaluation.paper_numbers import paper_names_from_config
from verbmirage.benchmark.questions import question_kind
from verbmirage.models.tiny import BUILDERS as TINY_BUILDERS
from verbmirage.variants.settings import Variant, model_variant_entry

for _configfile in workflow.configfiles:  # Snakemake's YAML reader keeps the last of two equal keys silently
    check_yaml_file(_configfile)
check_schema(config, workflow.source_path("../schemas/config.schema.yaml"))  # one line per problem, key first
validate(config, workflow.source_path("../schemas/config.schema.yaml"))  # fills the defaults
check_config(config, workdir=os.getcwd())

# Each config its own tree (verbmirage.workflow.run_folders): results/, logs/, benchmarks/ for the demo's config.yaml,
# results/<name>/, logs/<name>/, benchmarks/<name>/ for configs/<name>.yaml or any other --configfile, or the
# folder of the `results_dir` key. Every artifact, log and benchmark path below is built with these three.
from verbmirage.workflow.run_folders import run_folders

RUN_FOLDERS = run_folders(config["results_dir"], workflow.overwrite_configfiles, os.getcwd(),
                          Path(workflow.main_snakefile).parent)


def in_results(path):
    """``path`` inside this config's results folder."""
    return f"{RUN_FOLDERS.results}/{path}"


def in_logs(path):
    """``path`` inside this config's logs folder."""
    return f"{RUN_FOLDERS.logs}/{path}"


def in_benchmarks(path):
    """``path`` inside this config's benchmarks folder."""
    return f"{RUN_FOLDERS.benchmarks}/{path}"


# Derived models (models.<slug>.derive, rules/derived.smk): from here on each is the entry its jobs load (its
# base's backend and settings, path or adapter = its built folder); DERIVED keeps their derive blocks.
from verbmirage.models.derived import derived_entries, effective_models

DERIVED_MODEL = in_results("models/{model}")  # Nullu's edited weights, a fine-tune's peft adapter
DERIVED = derived_entries(config)  # slug -> {method, base, ...settings}
config["models"] = effective_models(config, DERIVED_MODEL)

CHARADES = config["datasets"].get("charadesego")  # optional: Table 4 (ego vs exo)
DATASETS = ["hico"] + (["charadesego"] if CHARADES else [])
QSETS = config["questions"]["sets"]  # HICO's
DATASET_QSETS = {"hico": QSETS, "charadesego": list(CHARADES_QUESTION_SETS)}
CONDITIONS = list(config["conditions"])
# Conditions that need HICO-DET boxes (crop): HICO only, single-instance images only.
BOX_CONDITIONS = [c for c, s in config["conditions"].items() if CONDITION_TYPES[s["type"]].needs_boxes]
MODELS = list(config["models"])
VARIANTS = list(config["variants"])
ENSEMBLES = config["ensembles"]
# model -> the variants it runs: its `variants:` list, else those its backend can run (verbmirage.variants.settings);
# an ensemble runs the variants all its members run.
MODEL_VARIANTS = {m: model_variant_list(config, m) for m in [*config["models"], *ENSEMBLES]}
VARIANT_SETTINGS = {v: Variant.from_config(entry, f"variants.{v}") for v, entry in config["variants"].items()}


def variants_under(model, condition, dataset="hico"):
    """The variants ``model`` (or an ensemble) runs under ``condition`` on ``dataset``
    (``variants.<slug>.conditions`` and ``datasets``)."""
    return [v for v in MODEL_VARIANTS[model] if VARIANT_SETTINGS[v].runs_under(condition, dataset)]
CONSISTENCY_PAIRS = [tuple(pair) for pair in config["metrics"]["error_consistency"]]
HICO_ROOT = config["datasets"]["hico"]["root"]
HICO_DET_ROOT = config["datasets"]["hico"].get("det_root", "")  # "" -> no boxes, no image subsets
DOWNLOADS = config["downloads"]
TINY_FAMILIES = list(TINY_BUILDERS)


def _alternatives(names):
    """A regex matching exactly one of ``names`` (config slugs are [a-z0-9_])."""
    return "|".join(sorted(names, key=len, reverse=True)) or "(?!)"


wildcard_constraints:
    dataset=_alternatives(DATASETS),
    download=_alternatives(DOWNLOADS),
    qset=_alternatives(QSETS + list(CHARADES_QUESTION_SETS)),
    condition=_alternatives(CONDITIONS),
    reference=_alternatives(CONDITIONS),
    other=_alternatives(CONDITIONS),
    variant=_alternatives(VARIANTS),
    shard=r"\d+",


# ---- artifact paths: the only place they are spelled out -------------------
DOWNLOADED = f"{DOWNLOADS_FOLDER}/{{download}}"  # fetch_dataset unpacks (or links) a download here
DOWNLOAD_DONE = f"{DOWNLOADS_FOLDER}/{{download}}.done"


def _produced_by_download(root):
    """The flag of the download whose folder holds ``root``, or None."""
    for name in DOWNLOADS:
        folder = Path(DOWNLOADED.format(download=name))
        if Path(root) == folder or folder in Path(root).parents:
            return DOWNLOAD_DONE.format(download=name)
    return None


# What HICO jobs wait for: the files themselves, or the download that brings them.
HICO_ANNO = _produced_by_download(HICO_ROOT) or f"{HICO_ROOT}/anno.mat"
HICO_IMAGES = _produced_by_download(HICO_ROOT) or f"{HICO_ROOT}/images"


def _hico_det_boxes():
    """The HICO-DET file the tags are computed from (anno_bbox.mat or instances_test2015.json), or what makes it."""
    if not HICO_DET_ROOT:
        return []
    if Path(HICO_DET_ROOT) == Path(DEMO_HICO_DET_ROOT):
        return f"{DEMO_HICO_DET_ROOT}/anno_bbox.mat"
    return _produced_by_download(HICO_DET_ROOT) or str(hico_det_file(HICO_DET_ROOT) or f"{HICO_DET_ROOT}/anno_bbox.mat")


HICO_DET_BOXES = _hico_det_boxes()
CHARADES_ROOT = CHARADES["root"] if CHARADES else ""
CHARADES_SPLIT = CHARADES["split"] if CHARADES else "test"
CHARADES_CSV = _produced_by_download(CHARADES_ROOT) or f"{CHARADES_ROOT}/CharadesEgo/CharadesEgo_v1_{CHARADES_SPLIT}.csv"
CHARADES_VIDEO_FOLDER = (CHARADES.get("videos") or f"{CHARADES_ROOT}/CharadesEgo_v1_480") if CHARADES else ""
CHARADES_VIDEOS = _produced_by_download(CHARADES_VIDEO_FOLDER) or CHARADES_VIDEO_FOLDER
CHARADES_FRAMES = in_results("frames/charadesego")  # frames/{exo,ego}/<pair>_<action>.jpg
CHARADES_FRAME_TABLE = in_results("benchmark/charadesego/frames.parquet")
QUESTIONS = in_results("benchmark/{dataset}/{qset}.parquet")
IMAGE_TAGS = in_results("benchmark/hico/image_tags.parquet")  # per test image: HICO-DET tags (rule image_tags)
TRAIN_STATS = in_results("benchmark/{dataset}/train_stats.parquet")
CHARADES_QUESTIONS = QUESTIONS.format(dataset="charadesego", qset="{qset}")
CHARADES_TRAIN_STATS = TRAIN_STATS.format(dataset="charadesego")
QUESTION_COUNT_FILES = {ext: in_results(f"benchmark/{{dataset}}/counts.{ext}") for ext in ("parquet", "md")}
QUESTION_COUNTS = [path.format(dataset=d) for d in DATASETS for path in QUESTION_COUNT_FILES.values()]
CONDITION_DIR = in_results("images/{dataset}/{condition}")
PREDICTIONS = in_results("predictions/{dataset}/{qset}/{condition}/{model}/{variant}.parquet")
# One inference job's output (every question set it asks on one image shard): a folder with <qset>.parquet
# per set; its resumable parts, kept after success for reuse, live beside it in "<shard>.parts/<qset>/".
SUITE_SHARD = in_results("shards/{dataset}/{condition}/{model}/{variant}/{shard}")
# One metric job per run and one consistency job per (pair, model, variant), over all their question sets.
METRIC_PART = in_results("metrics/parts/{dataset}/{condition}/{model}/{variant}.parquet")
CONSISTENCY_PART = in_results("metrics/parts/{dataset}/{reference}_vs_{other}/{model}/{variant}.parquet")
METRICS = in_results("metrics/metrics.parquet")
TABLE_NUMBERS = [1, 2, 3] + ([4] if CHARADES else [])
TABLES = expand(in_results("tables/table{n}.{ext}"), n=TABLE_NUMBERS, ext=["parquet", "md"])
TABLES_HTML = expand(in_results("tables/table{n}.html"), n=TABLE_NUMBERS)
# slug -> the paper's model name: models.<slug>.paper_name; an ensemble of the paper's three members is its ensemble
TABLE_PAPER_NAMES = paper_names_from_config(config)
VARIANT_PAPER_NAMES = {v: s.get("paper_name", "") for v, s in config["variants"].items()}


# ---- paper Tables 5 and 8: mitigation methods, decoding strategies (rules/tables.smk) ----------------------
from verbmirage.evaluation.mitigation_tables import paper_method_pairs, paper_methods_from_config

# slug -> its Table 5 row (models.<slug>.paper_method: Nullu, REVERIE, ...); an unknown name stops the run here
TABLE5_PAPER_METHODS = paper_methods_from_config(config, DERIVED)
# slug -> LLaVA-1.5-7B where its row is the paper's method on the paper's model (else the paper's row stands alone)
TABLE5_METHOD_PAIRS = paper_method_pairs(config, TABLE5_PAPER_METHODS, DERIVED)
MITIGATION_TABLES = {n: [in_results(f"tables/table{n}.{ext}") for ext in ("parquet", "md", "html")] for n in (5, 8)}
MITIGATION_TABLE_OUTPUTS = [path for paths in MITIGATION_TABLES.values() for path in paths]


def mitigation_table_outputs(number):
    """Table 5 or 8 as Parquet, Markdown and HTML; the HTML in the report with its own caption."""
    parquet, markdown, html = MITIGATION_TABLES[number]
    caption = {5: "table5_mitigation.rst", 8: "table8_decoding.rst"}[number]
    return [parquet, markdown, report(html, category="Paper tables", caption=f"../report/{caption}")]


# ---- derived models (rules/derived.smk; models.<slug>.derive, docs/models.md "Derived models") ------------
DERIVED_MODELS = [DERIVED_MODEL.format(model=slug) for slug in DERIVED]
DERIVED_OUTPUTS = DERIVED_MODELS  # built even when no run asks the model (rule all)


def _nullu_data(derive):
    """Nullu's pairs: a LURE-format file (images under ``image_root``), else HICO's training labels and images."""
    if derive.get("pairs_file"):
        files = {"pairs_file": derive["pairs_file"]}
        return files, {**files, "image_root": derive.get("image_root", "")}
    return {"anno": HICO_ANNO, "images": HICO_IMAGES}, {"hico_root": HICO_ROOT}


# Pangea (datasets.pangea; derived/pangea.py): the training questions of a fine-tune that names no `questions`
# table (rule training_questions, rules/finetune.smk), built per derived slug, checked against HICO's test images.
PANGEA = config["datasets"].get("pangea")
PANGEA_ROOT = PANGEA["root"] if PANGEA else ""
PANGEA_FILE_KEYS = ("samples", "topology", "node_index")  # the pickles read (Label2Node: optional, not an input)
PANGEA_FILES = {key: _produced_by_download(PANGEA_ROOT) or f"{PANGEA_ROOT}/{PANGEA[key]}"
                for key in PANGEA_FILE_KEYS} if PANGEA else {}
PANGEA_IMAGES = (_produced_by_download(PANGEA_ROOT) or f"{PANGEA_ROOT}/{PANGEA['images']}") if PANGEA else ""
PANGEA_IMAGE_ROOT = f"{PANGEA_ROOT}/{PANGEA['images']}" if PANGEA else ""  # what a build reads
TRAINING_QUESTIONS = in_results("training/{model}/questions.parquet")
TRAINING_SOURCES = in_results("training/{model}/sources.parquet")  # per Pangea source: kept or why not, counts
TRAINING_SUMMARY = in_results("training/{model}/summary.md")  # our counts and node coverage beside the paper's
PANGEA_FINETUNES = [slug for slug, derive in DERIVED.items()
                    if derive["method"] == "lora_finetune" and not derive.get("questions")]
FINETUNE_OUTPUTS = [path.format(model=slug) for slug in PANGEA_FINETUNES
                    for path in (TRAINING_QUESTIONS, TRAINING_SOURCES, TRAINING_SUMMARY)]


def _lora_finetune_data(derive):
    """The fine-tune's training data (verbmirage.models.derived.finetune): its `questions` table and `images`
    folder, else the Pangea questions built for it and Pangea's images. A Pangea table depends on the derive
    block only, so entries with equal blocks share the first one's."""
    if derive.get("questions"):
        return ({"questions": derive["questions"], "train_images": derive["images"]},
                {"questions": derive["questions"], "images": derive["images"]})
    slug = next(slug for slug, other in DERIVED.items() if other == derive)
    table = TRAINING_QUESTIONS.format(model=slug)
    return {"questions": table, "train_images": PANGEA_IMAGES}, {"questions": table, "images": PANGEA_IMAGE_ROOT}


# method -> derive block -> (input files of rule derive_model, the paths its build reads as `inputs`)
DERIVE_DATA = {"nullu": _nullu_data, "lora_finetune": _lora_finetune_data}


def derive_inputs(wildcards):
    """A derived model's inputs: its base's built folders (tiny model, adapter) and its method's data."""
    derive = DERIVED[wildcards.model]
    base_files = entry_model_files(config["models"][derive["base"]])
    return {"base_files": base_files, **DERIVE_DATA[derive["method"]](derive)[0]}


def derive_base_settings(base):
    """The base entry a build loads: what its weights and prompts depend on, without planning keys and its own
    shards and batch size, so that only a change of these settings rebuilds."""
    return {key: value for key, value in model_settings(base).items() if key not in ("shards", "batch_size")}


def derive_data(wildcards):
    """The paths a derived model's build reads (its ``inputs`` argument)."""
    derive = DERIVED[wildcards.model]
    return DERIVE_DATA[derive["method"]](derive)[1]


# ---- dataset identity (verbmirage.data.identity) ------------------------------------------------------------
# Each job that reads a dataset takes its identity as the param `identity` (root, content digests of the
# annotation files, listings with sizes of the image and video folders); a changed identity reruns the job, also
# for data replaced under the same path with old modification times. Snakemake records a param function of
# `wildcards` only (not one of `input`) and calls it again just before its job runs, so data the run itself
# brings (the demo, a download) is recorded as built.
from verbmirage.data import identity as data_identity

DATA_PARTS = {
    "hico_annotations": lambda: data_identity.hico_annotations(HICO_ROOT),
    "hico_images": lambda: data_identity.hico_images(HICO_ROOT),
    "hico_boxes": lambda: data_identity.hico_boxes(HICO_DET_ROOT),
    "charadesego": lambda: data_identity.charades(CHARADES_ROOT, CHARADES_VIDEO_FOLDER),
    "pangea": lambda: data_identity.pangea(PANGEA, PANGEA_FILE_KEYS),
}


def identity(*parts):
    """The ``identity`` param of a rule that reads the named parts of ``DATA_PARTS``."""
    return lambda wildcards: {part: DATA_PARTS[part]() for part in parts}


def image_identity(wildcards):
    """An image condition's source: HICO's image folder (CharadesEgo's frames are built by rule charades_frames)."""
    return identity("hico_images")(wildcards) if wildcards.dataset == "hico" else {}


def derive_identity(wildcards):
    """The data a derived model trains on: HICO (Nullu without a pairs file), Pangea (a fine-tune without its own
    questions); a user's pairs file or question table is tracked by its modification time only."""
    derive = DERIVED[wildcards.model]
    if derive["method"] == "nullu" and not derive.get("pairs_file"):
        return identity("hico_annotations", "hico_images")(wildcards)
    if derive["method"] == "lora_finetune" and not derive.get("questions"):
        return identity("pangea")(wildcards)
    return {}


# ---- input functions ---------------------------------------------------------
def model_resource(key, default):
    """Resource of the prediction job, from the model entry's ``resources``."""
    return lambda wildcards: config["models"][wildcards.model].get("resources", {}).get(key, default)


def n_shards(model):
    return config["models"][model].get("shards", config["inference"]["shards"])


def run_shards(dataset, condition, wildcards):
    """The output folders of a run's inference jobs (one per image shard)."""
    return expand(SUITE_SHARD, dataset=dataset, condition=condition, model=wildcards.model,
                  variant=wildcards.variant, shard=range(n_shards(wildcards.model)))


def partial_images(dataset, condition):
    """A box condition's folder (its manifest names the images it covers); none for the others."""
    return CONDITION_DIR.format(dataset=dataset, condition=condition) if condition in BOX_CONDITIONS else []


def suite_qsets(wildcards):
    """The question sets one inference job asks: those of its dataset asked under its condition by its model."""
    return [q for q in condition_qsets(wildcards.dataset, wildcards.condition)
            if asks(wildcards.dataset, wildcards.condition, q, wildcards.model, wildcards.variant)]


def suite_questions(wildcards):
    """The question tables of :func:`suite_qsets`, in the same order."""
    return [QUESTIONS.format(dataset=wildcards.dataset, qset=q) for q in suite_qsets(wildcards)]


def merge_groups(models):
    """(dataset, condition, sets, models, variant): the models (or ensembles) that ask the same sets under a
    condition with a variant, whose per-set prediction tables one rule writes together (one variant per group,
    so two groups never claim the same run)."""
    groups = {}
    for d in DATASETS:
        for c in dataset_conditions(d):
            for m in models:
                for v in variants_under(m, c, d):
                    sets = tuple(q for q in condition_qsets(d, c) if asks(d, c, q, m, v))
                    if sets:
                        groups.setdefault((d, c, sets, v), []).append(m)
    return [(d, c, list(sets), models, v) for (d, c, sets, v), models in groups.items()]


def model_files(wildcards):
    """A model folder the workflow builds itself (resources/models/tiny_*, a derived model's folder) and a
    LoRA ``adapter`` folder are inputs of its jobs."""
    return entry_model_files(config["models"][wildcards.model])


def entry_model_files(entry):
    """The folders of a model entry that the workflow builds (tiny models, derived models) or that hold its
    LoRA ``adapter``: inputs of every job that loads it."""
    path = entry.get("path", "")
    built = [f"resources/models/tiny_{family}" for family in TINY_FAMILIES] + DERIVED_MODELS
    return ([path] if path in built else []) + ([entry["adapter"]] if entry.get("adapter") else [])




def image_source(wildcards):
    """The folder a dataset's question images live in (or what produces it)."""
    return HICO_IMAGES if wildcards.dataset == "hico" else CHARADES_FRAMES


def image_root(wildcards):
    return HICO_ROOT if wildcards.dataset == "hico" else CHARADES_FRAMES


def dataset_conditions(dataset):
    """The conditions a dataset is asked under (box conditions such as crop: HICO only)."""
    return [c for c in CONDITIONS if condition_qsets(dataset, c)]


def condition_qsets(dataset, condition):
    """The question sets of ``dataset`` asked under ``condition`` (``conditions.<slug>.qsets``, default all)."""
    return condition_question_sets(config, condition, dataset, DATASET_QSETS[dataset])


def asks(dataset, condition, qset, model, variant=None):
    """Whether the run asks ``model`` (or an ensemble) question set ``qset`` under ``condition`` (with
    ``variant``: also ``variants.<slug>.qsets``)."""
    chosen = model_question_sets(config, model)
    return (qset in condition_qsets(dataset, condition) and (chosen is None or qset in chosen)
            and (variant is None or VARIANT_SETTINGS[variant].asks(qset)))


# Entry keys that plan or label a run without changing any answer: kept out of the inference params and fingerprint.
LABEL_KEYS = ("qsets", "paper_name", "paper_method")


def model_settings(model):
    """What a model's answers depend on: its entry without the keys that plan or label its runs
    (``verbmirage.models.registry.PLANNING_KEYS``)."""
    return {key: value for key, value in config["models"][model].items() if key not in MODEL_PLANNING_KEYS}


def variant_settings(variant, model):
    """What a variant's answers depend on as ``model`` runs it (its ``variant_settings`` on top), without
    ``paper_name``."""
    return {key: value for key, value in model_variant_entry(config, model, variant).items() if key not in LABEL_KEYS}


def condition_settings(condition):
    """What a condition's images and answers depend on: its entry without ``qsets``."""
    return image_settings(config["conditions"][condition])


def partial_condition_images(wildcards):
    """A box condition's folder: its manifest names the images (so the questions) it covers; none otherwise."""
    if wildcards.condition not in BOX_CONDITIONS:
        return []
    return CONDITION_DIR.format(dataset=wildcards.dataset, condition=wildcards.condition)


def partial_pair_images(wildcards):
    """The folders of the box conditions of an error-consistency pair (their questions are the shared ones)."""
    return [
        CONDITION_DIR.format(dataset=wildcards.dataset, condition=c)
        for c in (wildcards.reference, wildcards.other)
        if c in BOX_CONDITIONS
    ]


def condition_tags_input(wildcards):
    """The image tags a box condition takes its single-instance union boxes from."""
    return IMAGE_TAGS if wildcards.condition in BOX_CONDITIONS else []


def image_tags_input(wildcards):
    """The tags a HICO metric job turns into image subsets; none without boxes or for other datasets."""
    return IMAGE_TAGS if wildcards.dataset == "hico" and HICO_DET_ROOT else []


def dataset_questions(wildcards):
    return expand(QUESTIONS, dataset=wildcards.dataset, qset=DATASET_QSETS[wildcards.dataset])


def run_qsets(wildcards):
    """The question sets a run (dataset, condition, model, variant) answered, in config order."""
    return [q for q in DATASET_QSETS[wildcards.dataset] if asks(wildcards.dataset, wildcards.condition, q,
                                                                  wildcards.model, wildcards.variant)]


def run_tables(wildcards, pattern):
    """One path of ``pattern`` (QUESTIONS or PREDICTIONS) per set of the run, in :func:`run_qsets` order."""
    return [pattern.format(**{**wildcards, "qset": q}) for q in run_qsets(wildcards)]


def pair_qsets(wildcards):
    """The sets a model answered under both conditions of an error-consistency pair."""
    d, m, v = wildcards.dataset, wildcards.model, wildcards.variant
    return [q for q in DATASET_QSETS[d] if asks(d, wildcards.reference, q, m, v) and asks(d, wildcards.other, q, m, v)]


def pair_tables(wildcards, pattern, side=None):
    """One path per set of :func:`pair_qsets`; ``side`` ("reference"/"other") picks that condition's run."""
    condition = {"condition": wildcards[side]} if side else {}
    return [pattern.format(**{**wildcards, "qset": q, **condition}) for q in pair_qsets(wildcards)]


def all_scored():
    """Every run (dataset, condition, model or ensemble, variant) the metrics cover."""
    return [
        METRIC_PART.format(dataset=d, condition=c, model=m, variant=v)
        for d in DATASETS
        for c in dataset_conditions(d)
        for m in MODELS + list(ENSEMBLES)
        for v in variants_under(m, c, d)
        if any(asks(d, c, q, m, v) for q in condition_qsets(d, c))
    ]


def all_consistency():
    return [
        CONSISTENCY_PART.format(dataset=d, reference=a, other=b, model=m, variant=v)
        for d in ["hico"]  # paper Table 2 (HICO); CharadesEgo compares views, not conditions
        for a, b in CONSISTENCY_PAIRS
        for m in MODELS + list(ENSEMBLES)
        for v in variants_under(m, a)
        if v in variants_under(m, b)
        if any(asks(d, a, q, m, v) and asks(d, b, q, m, v) for q in condition_qsets(d, a))
    ]


def planned_cells():
    """(dataset, condition, model or ensemble, variant, qset) of each set a run of :func:`all_scored` asks, and
    (condition ``<reference>_vs_<other>``) of each pair of :func:`all_consistency`: the paper tables keep the
    row of a planned run whose metrics are missing or all undefined (``verbmirage.evaluation.tables.measured_rows``)."""
    runs = [*MODELS, *ENSEMBLES]
    scored = [(d, c, m, v, q) for d in DATASETS for c in dataset_conditions(d) for m in runs
              for v in variants_under(m, c, d) for q in condition_qsets(d, c) if asks(d, c, q, m, v)]
    pairs = [("hico", f"{a}_vs_{b}", m, v, q) for a, b in CONSISTENCY_PAIRS for m in runs
             for v in variants_under(m, a) if v in variants_under(m, b)
             for q in condition_qsets("hico", a) if asks("hico", a, q, m, v) and asks("hico", b, q, m, v)]
    return scored + pairs


PLANNED_CELLS = planned_cells()
MERGE_GROUPS = merge_groups(MODELS)  # one merge rule each (rules/inference.smk)
ENSEMBLE_GROUPS = merge_groups(list(ENSEMBLES))  # one vote rule each (rules/ensembles.smk)


# ---- figures: each PNG has a PDF and an SVG beside it (verbmirage.analysis.figure_layout) -------------------
from verbmirage.analysis.figure_layout import companion_paths as _companion_paths


def figure_prints(*pngs):
    """The PDF and SVG each figure is saved as beside its PNG (for papers), declared as the rule's outputs."""
    return [str(path) for png in pngs for path in _companion_paths(png)]


# ---- attention analysis (rules/analysis.smk; analysis.attention in config) --------------
from verbmirage.analysis.attention import attention_models
from verbmirage.analysis.attention_figures import figure_models

ATTENTION_SETTINGS = config.get("analysis", {}).get("attention") or {}
ATTENTION_MODELS = attention_models(config)  # slug -> model entry (models: or analysis.attention.extra_models)
ATTENTION_QSETS = ATTENTION_SETTINGS.get("qsets", [])  # checked against questions.sets by attention_models
ATTENTION_CONDITIONS = ATTENTION_SETTINGS.get("conditions", [])
ATTENTION_PART = in_results("analysis/attention/{dataset}/{condition}/{model}.parquet")  # one job: every set, model loaded once
ATTENTION_TABLE = in_results("analysis/attention.parquet")
ATTENTION_FIGURES = {n: in_results(f"figures/fig{n}_attention.png") for n in (7, 8, 13, 14)}
ATTENTION_SUMMARY = expand(in_results("analysis/attention_summary.{ext}"), ext=["parquet", "html"])
ATTENTION_OUTPUTS = [ATTENTION_TABLE, *ATTENTION_SUMMARY, *ATTENTION_FIGURES.values()] if ATTENTION_MODELS else []


def attention_resource(key, default):
    """Resource of an attention job, from its model entry's ``resources`` (as for ``predict``)."""
    return lambda wildcards: ATTENTION_MODELS[wildcards.model].get("resources", {}).get(key, default)


def attention_model_files(wildcards):
    """A tiny or derived model the workflow builds itself, and a LoRA ``adapter`` folder, are inputs of the
    attention jobs that load them."""
    return entry_model_files(ATTENTION_MODELS[wildcards.model])


def attention_parts():
    return [
        ATTENTION_PART.format(dataset="hico", condition=c, model=m)
        for c in ATTENTION_CONDITIONS
        for m in ATTENTION_MODELS
    ]


def attention_questions(wildcards):
    """The question tables one attention job probes: every set of ``analysis.attention.qsets``, in that order."""
    return [QUESTIONS.format(dataset=wildcards.dataset, qset=q) for q in ATTENTION_QSETS]


def attention_figure_roles():
    """Figure number -> model slug (config ``analysis.attention.figures``, else the paper's roles)."""
    backends = {slug: entry["backend"] for slug, entry in ATTENTION_MODELS.items()}
    return figure_models(list(ATTENTION_MODELS), backends, ATTENTION_SETTINGS.get("figures"))


# ---- VCD divergence (rules/analysis.smk; on whenever a model runs a VCD variant; analysis.vcd_divergence) ----
from verbmirage.analysis.vcd_divergence import divergence_runs, vcd_divergence_settings

VCD_DIVERGENCE_SETTINGS = vcd_divergence_settings(config)  # checked; defaults when the block is absent
def _planned(run, variant):
    """Whether the workflow runs ``variant`` of the run's model, condition and set (variants' planning keys)."""
    return (variant in variants_under(run["model"], run["condition"])
            and asks("hico", run["condition"], run["qset"], run["model"], variant))


VCD_DIVERGENCE_RUNS = [  # each VCD run read, with its plain counterpart's table (None: no flips, plain_note says why)
    {**run,
     "questions": QUESTIONS.format(dataset="hico", qset=run["qset"]),
     "predictions": PREDICTIONS.format(dataset="hico", qset=run["qset"], condition=run["condition"],
                                       model=run["model"], variant=run["variant"]),
     "plain": PREDICTIONS.format(dataset="hico", qset=run["qset"], condition=run["condition"], model=run["model"],
                                 variant=run["plain_variant"]) if run["plain_variant"] else None}
    for run in [
        run if not run["plain_variant"] or _planned(run, run["plain_variant"])
        else {**run, "plain_variant": None, "plain_note": f"'{run['plain_variant']}' is not run on this set"}
        for run in divergence_runs(config, {m: MODEL_VARIANTS[m] for m in MODELS},
                                   lambda condition, qset, model: asks("hico", condition, qset, model),
                                   VCD_DIVERGENCE_SETTINGS)
    ]
    if _planned(run, run["variant"])
]
VCD_DIVERGENCE_TABLE = in_results("analysis/vcd_divergence.parquet")
VCD_DIVERGENCE_HTML = in_results("analysis/vcd_divergence.html")
VCD_KL_HIST = in_results("analysis/vcd_kl_hist.parquet")
VCD_DIVERGENCE_FIGURE = in_results("figures/vcd_divergence.png")
VCD_DIVERGENCE_OUTPUTS = (
    [VCD_DIVERGENCE_TABLE, VCD_DIVERGENCE_HTML, VCD_KL_HIST, VCD_DIVERGENCE_FIGURE] if VCD_DIVERGENCE_RUNS else []
)


def vcd_divergence_predictions():
    """Every prediction table the analysis reads: the VCD runs and their plain counterparts."""
    return sorted({run["predictions"] for run in VCD_DIVERGENCE_RUNS}
                  | {run["plain"] for run in VCD_DIVERGENCE_RUNS if run["plain"]})


def vcd_divergence_notes():
    """The figure's note for a tiny demo model (random weights)."""
    return {run["model"]: "tiny model with RANDOM weights: KL and flips are noise, the figure only shows the layout"
            for run in VCD_DIVERGENCE_RUNS if "tiny_" in str(config["models"][run["model"]].get("path", ""))}


# ---- Known-Object mAP, Fig. 11 (rules/known_object.smk; analysis.known_object in config) ----------------
from dataclasses import asdict as _asdict

from verbmirage.analysis.known_object import known_object_settings

KNOWN_OBJECT = known_object_settings(config)  # None: off; checked against models, question sets and conditions
KNOWN_OBJECT_PARAMS = _asdict(KNOWN_OBJECT) if KNOWN_OBJECT else {}
KNOWN_OBJECT_AP = in_results("metrics/ap_per_hoi.parquet")
KNOWN_OBJECT_METRIC_PART = in_results("metrics/parts/analysis/known_object.parquet")  # read by rule metrics
KNOWN_OBJECT_METRIC_PARTS = [KNOWN_OBJECT_METRIC_PART] if KNOWN_OBJECT else []
KNOWN_OBJECT_FIGURE = in_results("figures/fig11_known_object_ap.png")
KNOWN_OBJECT_OUTPUTS = [KNOWN_OBJECT_AP, KNOWN_OBJECT_FIGURE] if KNOWN_OBJECT else []
KNOWN_OBJECT_QUESTIONS = QUESTIONS.format(dataset="hico", qset=KNOWN_OBJECT.qset) if KNOWN_OBJECT else []
KNOWN_OBJECT_RUNS = {  # "condition/model/variant" -> its prediction table
    f"{c}/{m}/{v}": PREDICTIONS.format(dataset="hico", qset=KNOWN_OBJECT.qset, condition=c, model=m, variant=v)
    for c in KNOWN_OBJECT.conditions
    for m in KNOWN_OBJECT.models
    for v in variants_under(m, c)
    if asks("hico", c, KNOWN_OBJECT.qset, m, v)
} if KNOWN_OBJECT else {}
KNOWN_OBJECT_PARTIAL_IMAGES = {  # crop conditions: only the questions on their images are ranked
    c: CONDITION_DIR.format(dataset="hico", condition=c) for c in KNOWN_OBJECT.conditions if c in BOX_CONDITIONS
} if KNOWN_OBJECT else {}
KNOWN_OBJECT_MODEL_ENTRIES = {  # backends mark the paper's numbers on Fig. 11; paths flag the tiny models
    m: config["models"].get(m, {"backend": "ensemble"}) for m in KNOWN_OBJECT.models
} if KNOWN_OBJECT else {}


# ---- token uncertainty and field of view (rules/uncertainty.smk; analysis.uncertainty, analysis.fov) ----
from verbmirage.analysis.fov import fov_settings
from verbmirage.analysis.uncertainty import token_probability_models, uncertainty_settings

UNCERTAINTY = uncertainty_settings(config)  # None: the analysis is off
# Models whose `confidence` is an answer token's probability; the others (blind baselines, CLIP) are skipped.
TOKEN_MODELS = token_probability_models({m: config["models"][m] for m in MODELS})
NO_TOKEN_MODELS = [m for m in MODELS if m not in TOKEN_MODELS]
UNCERTAINTY_MODELS = [m for m in (UNCERTAINTY.models or MODELS) if m in TOKEN_MODELS] if UNCERTAINTY else []
FOV = fov_settings(config, {c: condition_qsets("hico", c) for c in CONDITIONS})  # None: off
UNCERTAINTY_HIST = in_results("analysis/uncertainty_hist.parquet")
UNCERTAINTY_METRIC_PART = in_results("metrics/parts/analysis/uncertainty.parquet")  # read by rule metrics
UNCERTAINTY_METRIC_PARTS = [UNCERTAINTY_METRIC_PART] if UNCERTAINTY else []
UNCERTAINTY_FIGURES = {n: in_results(f"figures/fig{n}_uncertainty.png") for n in (9, 12)}
FOV_SUMMARY = in_results("analysis/fov.parquet")
FOV_ROWS = in_results("analysis/fov_rows.parquet")  # the question rows behind fov.parquet (Fig. 10's boxes)
FOV_TABLE = {ext: in_results(f"tables/fov.{ext}") for ext in ("parquet", "md", "html")}
FOV_FIGURE = in_results("figures/fig10_fov.png")
UNCERTAINTY_OUTPUTS = ([UNCERTAINTY_HIST, *UNCERTAINTY_FIGURES.values()] if UNCERTAINTY else []) + (
    [FOV_SUMMARY, FOV_FIGURE, *FOV_TABLE.values()] if FOV else []
)


def uncertainty_runs():
    """The prediction tables the histograms read: each configured set asked under each configured condition."""
    return [
        {"model": m, "variant": v, "condition": c, "qset": q,
         "questions": QUESTIONS.format(dataset="hico", qset=q),
         "predictions": PREDICTIONS.format(dataset="hico", qset=q, condition=c, model=m, variant=v)}
        for c in UNCERTAINTY.conditions
        for q in UNCERTAINTY.qsets
        for m in UNCERTAINTY_MODELS
        for v in variants_under(m, c)
        if asks("hico", c, q, m, v)
    ] if UNCERTAINTY else []


def fov_runs():
    """Per (model, variant, FOV set): its questions and its prediction table under every FOV condition."""
    return [
        {"model": m, "variant": v, "qset": q, "questions": QUESTIONS.format(dataset="hico", qset=q),
         "predictions": {c: PREDICTIONS.format(dataset="hico", qset=q, condition=c, model=m, variant=v)
                         for c in FOV.conditions}}
        for q in FOV.qsets
        for m in MODELS
        for v in MODEL_VARIANTS[m]
        if all(v in variants_under(m, c) and asks("hico", c, q, m, v) for c in FOV.conditions)
    ] if FOV else []


def model_backends():
    return {slug: entry["backend"] for slug, entry in config["models"].items()}


def random_weight_notes():
    """A note for the figures of the tiny demo models: their weights are random, their u is noise."""
    return {slug: "tiny model with RANDOM weights: u is noise, the figure only shows the layout"
            for slug, entry in config["models"].items() if "tiny_" in str(entry.get("path", ""))}


# ---- the paper's Figs. 1, 3, 4(b), 5, 6 (rules/figures.smk) -----------------------------------------------
from verbmirage.analysis.paper_figures import variant_decoding

PAPER_FIGURE_PAIR = next(  # Fig. 4(b): the noise pair of Table 2 (the first pair with a salt-and-pepper condition)
    (pair for pair in CONSISTENCY_PAIRS if config["conditions"][pair[1]]["type"] == "saltpepper"),
    CONSISTENCY_PAIRS[0] if CONSISTENCY_PAIRS else None,
)
PAPER_FIGURES = {
    "fig1": in_results("figures/fig1_object_vs_verb.png"),
    "fig3": in_results("figures/fig3_rare_common.png"),
    **({"fig4b": in_results("figures/fig4b_error_consistency.png")} if PAPER_FIGURE_PAIR else {}),
    **({"fig5": in_results("figures/fig5_ego_exo.png")} if CHARADES else {}),  # CharadesEgo only
    **({"fig6": in_results("figures/fig6_ambiguity.png")} if HICO_DET_ROOT else {}),  # needs the HICO-DET tags
}
PAPER_FIGURE_OUTPUTS = list(PAPER_FIGURES.values())
# how the legend names the bars' decoding (the first variant's): the paper's name for it, else greedy, beam5, ...
PAPER_FIGURE_DECODING = variant_decoding(config["variants"][VARIANTS[0]])


# ---- object reliance: Fig. 15, Tables 6 and 7 (rules/reliance.smk; analysis.object_reliance in config) ----
from verbmirage.analysis.object_reliance import RELIANCE_QSETS as _RELIANCE_QSETS, reliance_plan

RELIANCE = reliance_plan(config)  # None when analysis.object_reliance is absent; checked, defaults resolved
RELIANCE_QSETS = list(_RELIANCE_QSETS)
RELIANCE_MODELS = RELIANCE["models"] if RELIANCE else []
# the config block (thresholds, schema defaults filled) with models, condition, variant, figure_model resolved
RELIANCE_SETTINGS = (
    {**config["analysis"]["object_reliance"], **{k: v for k, v in RELIANCE.items() if k != "settings"}}
    if RELIANCE
    else {}
)
RELIANCE_OBJECTS = in_results("analysis/object_reliance.parquet")
RELIANCE_VERBS = in_results("analysis/verb_influence.parquet")
RELIANCE_METRIC_PART = in_results("metrics/parts/analysis/object_reliance.parquet")  # read by rule metrics
RELIANCE_METRIC_PARTS = [RELIANCE_METRIC_PART] if RELIANCE else []
RELIANCE_TABLES = {n: [in_results(f"tables/table{n}.{ext}") for ext in ("parquet", "md", "html")] for n in (6, 7)}
RELIANCE_FIGURE = in_results("figures/fig15_object_reliance.png")
RELIANCE_OUTPUTS = [*RELIANCE_TABLES[6], *RELIANCE_TABLES[7], RELIANCE_FIGURE] if RELIANCE else []


def reliance_prediction_keys():
    """[model, qset] of every prediction table the analysis reads, in input order."""
    return [[m, q] for m in RELIANCE_MODELS for q in RELIANCE_QSETS]


def reliance_predictions():
    return [
        PREDICTIONS.format(dataset="hico", qset=q, condition=RELIANCE_SETTINGS["condition"], model=m,
                           variant=RELIANCE_SETTINGS["variant"])
        for m, q in reliance_prediction_keys()
    ]


def reliance_questions():
    return [QUESTIONS.format(dataset="hico", qset=q) for q in RELIANCE_QSETS] if RELIANCE else []


def reliance_condition_images():
    """A box condition's folder (its questions are those on its images); none for clean."""
    condition = RELIANCE_SETTINGS.get("condition")
    return CONDITION_DIR.format(dataset="hico", condition=condition) if condition in BOX_CONDITIONS else []


def reliance_table_outputs(number):
    """Table 6 or 7 as Parquet, Markdown and HTML; the HTML in the report beside Tables 1-4."""
    parquet, markdown, html = RELIANCE_TABLES[number]
    caption = {6: "table6_object_reliance.rst", 7: "table7_verb_influence.rst"}[number]
    return [parquet, markdown, report(html, category="Paper tables", caption=f"../report/{caption}")]


def reliance_figure_notes():
    """Fig. 15's note for a tiny demo model (random weights) or a model standing in for mPLUG-Owl2."""
    notes = {}
    for slug in RELIANCE_MODELS:
        entry = config["models"].get(slug, {})
        lines = []
        if "tiny_" in str(entry.get("path", "")):
            lines.append("tiny model with RANDOM weights: the deltas are noise, the figure only shows the layout")
        if entry.get("backend") != "mplug_owl2":
            lines.append("stands in for the paper's mPLUG-Owl2")
        notes[slug] = "; ".join(lines)
    return notes


# ---- calibrated decisions (rules/decisions.smk; variants.<slug>.decision, docs/variants.md) -----------------
from verbmirage.inference.calibration import decision_plan
from verbmirage.models.calibrated import calibration_qsets

DECISIONS = decision_plan(config)  # threshold / content_free variant slugs; the calibration images they share
CALIBRATION_QUESTIONS = in_results("benchmark/{dataset}/calibration/{qset}.parquet")  # YN protocol, training images
CALIBRATION_IMAGES = in_results("images/calibration/{dataset}/{condition}")  # those images under a condition
CALIBRATION_ANSWERS = in_results("calibration/{dataset}/{condition}/{model}/{variant}.answers")  # <qset>.parquet
CALIBRATION_CUTS = in_results("calibration/{dataset}/{condition}/{model}/{variant}.json")  # one cut per YN set
CONTENT_FREE_IMAGES = in_results("images/content_free/{dataset}")  # blank.png, mean.png (HICO training images)


def run_calibration_qsets(dataset, condition, model, variant=None):
    """The sets a threshold run fits a cut for: the HICO YN sets it asks (MC and CharadesEgo keep plain decisions)."""
    return calibration_qsets(dataset, [q for q in DATASET_QSETS[dataset]
                                       if asks(dataset, condition, q, model, variant)])


def calibration_runs():
    """(dataset, condition, model, variant) of every threshold run with a calibration set (one cuts file each)."""
    runs = []
    for m in MODELS:
        for d in DATASETS:
            for c in dataset_conditions(d):
                for v in [v for v in variants_under(m, c, d) if v in DECISIONS["threshold"]]:
                    if not run_calibration_qsets(d, c, m, v):
                        continue
                    if c in BOX_CONDITIONS:
                        raise ValueError(
                            f"conditions.{c}.qsets: model '{m}' with threshold variant '{v}' asks YN sets under "
                            f"'{c}', but its training images have no HICO-DET boxes to calibrate on; ask only MC "
                            f"sets under '{c}', or list models.{m}.variants without '{v}'"
                        )
                    runs.append({"dataset": d, "condition": c, "model": m, "variant": v})
    return runs


CALIBRATION_RUNS = calibration_runs()
DECISION_OUTPUTS = [CALIBRATION_CUTS.format(**run) for run in CALIBRATION_RUNS]


def calibration_run_tables(wildcards):
    """The calibration tables one threshold run asks, in :func:`run_calibration_qsets` order."""
    return [CALIBRATION_QUESTIONS.format(dataset=wildcards.dataset, qset=q)
            for q in run_calibration_qsets(wildcards.dataset, wildcards.condition, wildcards.model,
                                           wildcards.variant)]


def calibration_condition_tables(wildcards):
    """Every calibration table asked under a condition (its images folder covers them all)."""
    qsets = {q for run in CALIBRATION_RUNS if (run["dataset"], run["condition"]) == (wildcards.dataset,
                                                                                     wildcards.condition)
             for q in run_calibration_qsets(run["dataset"], run["condition"], run["model"], run["variant"])}
    return [CALIBRATION_QUESTIONS.format(dataset=wildcards.dataset, qset=q) for q in sorted(qsets)]


def decision_input(wildcards):
    """What a prediction job decides by: its run's cuts (threshold; none for a run without a calibration set)
    or the content-free images (content_free); nothing for the other variants."""
    if wildcards.variant in DECISIONS["threshold"]:
        run = {"dataset": wildcards.dataset, "condition": wildcards.condition, "model": wildcards.model,
               "variant": wildcards.variant}
        return CALIBRATION_CUTS.format(**run) if run in CALIBRATION_RUNS else []
    if wildcards.variant in DECISIONS["content_free"]:
        return CONTENT_FREE_IMAGES.format(dataset="hico")  # HICO's, for every dataset
    return []
