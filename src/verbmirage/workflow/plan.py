"""The run plan: from the checked config, every run, group and input path the workflow's jobs need.

:meth:`Plan.from_config` reads a config that ``rules/common.smk`` has checked (``check_config``) and filled
with the schema's defaults, and decides:

- what runs: the datasets, their question sets, the conditions, the models (derived entries resolved) and the
  variants each runs (:meth:`Plan.variants_under`), and whether a run asks a set (:meth:`Plan.asks`);
- how the runs are grouped into jobs: one inference job per image shard of a run, one merge rule per group
  of runs asking the same sets (:attr:`Plan.merge_groups`), one vote rule per ensemble group, one metric job
  per scored run (:attr:`Plan.scored`), one consistency job per pair (:attr:`Plan.consistency`), one
  calibration job per threshold run (:attr:`Plan.calibration_runs`), one build per derived model;
- what each analysis reads (attention, VCD divergence, Known-Object mAP, uncertainty and field of view,
  object reliance, the paper's tables and figures) and rule ``all``'s targets (:attr:`Plan.targets`).

Every path comes from :class:`verbmirage.workflow.paths.Paths`. Nothing here imports Snakemake: the rules'
input functions in ``rules/common.smk`` call these methods with their wildcards' values, and the tests
build the plan of any config directly. Per-analysis settings stay with their analysis
(``verbmirage.analysis.*``: ``*_settings``, ``*_plan``, ``*_runs``) and are called from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from verbmirage.analysis.attention import attention_models
from verbmirage.analysis.attention_figures import figure_models
from verbmirage.analysis.figure_layout import companion_paths
from verbmirage.analysis.fov import fov_settings
from verbmirage.analysis.known_object import known_object_settings
from verbmirage.analysis.object_reliance import RELIANCE_QSETS, reliance_plan
from verbmirage.analysis.paper_figures import variant_decoding
from verbmirage.analysis.uncertainty import token_probability_models, uncertainty_settings
from verbmirage.analysis.vcd_divergence import divergence_runs, vcd_divergence_settings
from verbmirage.benchmark.conditions import CONDITIONS as CONDITION_TYPES
from verbmirage.benchmark.conditions import image_settings
from verbmirage.data import identity as data_identity
from verbmirage.data.charades import CHARADES_QUESTION_SETS
from verbmirage.data.hico import hico_det_file
from verbmirage.evaluation.mitigation_tables import paper_method_pairs, paper_methods_from_config
from verbmirage.evaluation.paper_numbers import paper_names_from_config
from verbmirage.inference.calibration import decision_plan
from verbmirage.models.calibrated import calibration_qsets
from verbmirage.models.derived import derived_entries, effective_models
from verbmirage.models.entries import model_question_sets, model_variant_list
from verbmirage.models.registry import PLANNING_KEYS as MODEL_PLANNING_KEYS
from verbmirage.models.tiny import BUILDERS as TINY_BUILDERS
from verbmirage.variants.settings import Variant, model_variant_entry
from verbmirage.workflow import paths as P
from verbmirage.workflow.config import condition_question_sets
from verbmirage.workflow.paths import Paths
from verbmirage.workflow.run_folders import RunFolders

#: Variant entry keys that plan or label a run without changing any answer: kept out of the inference params
#: and fingerprint.
LABEL_KEYS = ("qsets", "paper_name", "paper_method")
#: Pangea's pickles a fine-tune reads (Label2Node: optional, not an input).
PANGEA_FILE_KEYS = ("samples", "topology", "node_index")
#: Report caption of each table written in three forms (rules/tables.smk, rules/reliance.smk).
TABLE_CAPTIONS = {5: "table5_mitigation.rst", 8: "table8_decoding.rst", 6: "table6_object_reliance.rst",
                  7: "table7_verb_influence.rst"}


def alternatives(names) -> str:
    """A regex matching exactly one of ``names`` (config slugs are [a-z0-9_]); one that matches nothing for
    none."""
    return "|".join(sorted(names, key=len, reverse=True)) or "(?!)"


def figure_prints(*pngs: str) -> list[str]:
    """The PDF and SVG each figure is saved as beside its PNG (for papers), declared as the rule's outputs."""
    return [str(path) for png in pngs for path in companion_paths(png)]


def _is_tiny(entry: dict) -> bool:
    return "tiny_" in str(entry.get("path", ""))


@dataclass(frozen=True)
class Run:
    """One run: ``model`` (or an ensemble) with ``variant`` under ``condition`` on ``dataset``, asking ``qsets``
    (config order). One metric job each; one inference job per image shard for a model."""

    dataset: str
    condition: str
    model: str
    variant: str
    qsets: tuple[str, ...]


@dataclass(frozen=True)
class PairRun:
    """One error-consistency job: a model's run under two conditions (Table 2), on the sets both ask."""

    dataset: str
    reference: str
    other: str
    model: str
    variant: str
    qsets: tuple[str, ...]


@dataclass(frozen=True)
class Group:
    """The models (or ensembles) that ask the same ``qsets`` under ``condition`` with ``variant``: one merge (or
    vote) rule writes their per-set prediction tables (a rule's outputs cannot depend on its wildcards)."""

    dataset: str
    condition: str
    qsets: list[str]
    models: list[str]
    variant: str


@dataclass(frozen=True)
class CalibrationRun:
    """A threshold run with a calibration set: one ``calibrate_decision`` job, one cuts file."""

    dataset: str
    condition: str
    model: str
    variant: str


@dataclass(repr=False)  # a config's whole plan: too long to print
class Plan:
    """Everything the workflow runs for one checked config, and every path it reads or writes."""

    config: dict  # the checked config, ``models`` with derived entries resolved (:func:`effective_models`)
    paths: Paths
    derived: dict[str, dict]  # slug -> its ``derive`` block
    datasets: list[str]
    dataset_qsets: dict[str, list[str]]
    conditions: list[str]
    box_conditions: list[str]  # need HICO-DET boxes (crop): HICO only, single-instance images only
    models: list[str]
    variants: list[str]
    ensembles: dict[str, list[str]]
    model_variants: dict[str, list[str]]  # model or ensemble -> the variants it runs
    variant_settings: dict[str, Variant]
    consistency_pairs: list[tuple[str, str]]
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, config: dict, folders: RunFolders) -> Plan:
        """The plan of ``config`` (checked, defaults filled), writing to ``folders``. ``config`` is not changed:
        :attr:`config` is a copy whose ``models`` resolve the derived entries (the entry their jobs load)."""
        paths = Paths(folders)
        derived = derived_entries(config)
        config = {**config, "models": effective_models(config, paths.derived_model)}
        charades = config["datasets"].get("charadesego")
        ensembles = config["ensembles"]
        plan = cls(
            config=config,
            paths=paths,
            derived=derived,
            datasets=["hico"] + (["charadesego"] if charades else []),
            dataset_qsets={"hico": config["questions"]["sets"], "charadesego": list(CHARADES_QUESTION_SETS)},
            conditions=list(config["conditions"]),
            box_conditions=[c for c, s in config["conditions"].items() if CONDITION_TYPES[s["type"]].needs_boxes],
            models=list(config["models"]),
            variants=list(config["variants"]),
            ensembles=ensembles,
            model_variants={m: model_variant_list(config, m) for m in [*config["models"], *ensembles]},
            variant_settings={v: Variant.from_config(entry, f"variants.{v}")
                              for v, entry in config["variants"].items()},
            consistency_pairs=[tuple(pair) for pair in config["metrics"]["error_consistency"]],
        )
        plan.check()
        return plan

    def check(self) -> None:
        """Plan every analysis now, so that a config error stops the run before any job, naming its key
        (an unknown ``paper_method``, an analysis's settings, a threshold run that cannot be calibrated)."""
        for name in ("hico_det_boxes", "paper_names", "method_pairs", "planned_cells", "merge_groups",
                     "ensemble_groups", "attention_models", "vcd_divergence_runs", "known_object", "uncertainty",
                     "fov", "paper_figure_decoding", "reliance", "calibration_runs"):
            getattr(self, name)

    # ---- what runs -------------------------------------------------------------------------------------------
    @property
    def qsets(self) -> list[str]:
        """HICO's question sets (``questions.sets``)."""
        return self.dataset_qsets["hico"]

    @property
    def tiny_families(self) -> list[str]:
        """The transformers families rule tiny_model builds a random-weight model of."""
        return list(TINY_BUILDERS)

    @property
    def charades(self) -> dict | None:
        return self.config["datasets"].get("charadesego")  # optional: Table 4 (ego vs exo)

    def variants_under(self, model: str, condition: str, dataset: str = "hico") -> list[str]:
        """The variants ``model`` (or an ensemble) runs under ``condition`` on ``dataset``
        (``variants.<slug>.conditions`` and ``datasets``)."""
        return [v for v in self.model_variants[model] if self.variant_settings[v].runs_under(condition, dataset)]

    def condition_qsets(self, dataset: str, condition: str) -> list[str]:
        """The question sets of ``dataset`` asked under ``condition`` (``conditions.<slug>.qsets``, default all)."""
        return condition_question_sets(self.config, condition, dataset, self.dataset_qsets[dataset])

    def dataset_conditions(self, dataset: str) -> list[str]:
        """The conditions a dataset is asked under (box conditions such as crop: HICO only)."""
        return [c for c in self.conditions if self.condition_qsets(dataset, c)]

    def asks(self, dataset: str, condition: str, qset: str, model: str, variant: str | None = None) -> bool:
        """Whether the run asks ``model`` (or an ensemble) question set ``qset`` under ``condition`` (with
        ``variant``: also ``variants.<slug>.qsets``)."""
        chosen = model_question_sets(self.config, model)
        return (qset in self.condition_qsets(dataset, condition) and (chosen is None or qset in chosen)
                and (variant is None or self.variant_settings[variant].asks(qset)))

    def run_qsets(self, dataset: str, condition: str, model: str, variant: str) -> list[str]:
        """The question sets a run asks (answers), in config order: those its inference job asks, its metric
        job scores."""
        return [q for q in self.condition_qsets(dataset, condition) if self.asks(dataset, condition, q, model, variant)]

    def pair_qsets(self, dataset: str, reference: str, other: str, model: str, variant: str) -> list[str]:
        """The sets a model answered under both conditions of an error-consistency pair."""
        return [q for q in self.dataset_qsets[dataset]
                if self.asks(dataset, reference, q, model, variant) and self.asks(dataset, other, q, model, variant)]

    @property
    def scored(self) -> list[Run]:
        """Every run (dataset, condition, model or ensemble, variant) the metrics cover."""
        return self._once("scored", lambda: [
            Run(d, c, m, v, tuple(sets))
            for d in self.datasets
            for c in self.dataset_conditions(d)
            for m in self.models + list(self.ensembles)
            for v in self.variants_under(m, c, d)
            if (sets := self.run_qsets(d, c, m, v))
        ])

    @property
    def consistency(self) -> list[PairRun]:
        """Every error-consistency job: HICO only (paper Table 2; CharadesEgo compares views, not conditions)."""
        return self._once("consistency", lambda: [
            PairRun("hico", a, b, m, v, tuple(sets))
            for a, b in self.consistency_pairs
            for m in self.models + list(self.ensembles)
            for v in self.variants_under(m, a)
            if v in self.variants_under(m, b)
            if (sets := [q for q in self.condition_qsets("hico", a)
                         if self.asks("hico", a, q, m, v) and self.asks("hico", b, q, m, v)])
        ])

    @property
    def planned_cells(self) -> list[tuple[str, str, str, str, str]]:
        """(dataset, condition, model or ensemble, variant, qset) of each set a scored run asks, and (condition
        ``<reference>_vs_<other>``) of each consistency pair's set: the paper tables keep the row of a planned run
        whose metrics are missing or all undefined (``verbmirage.evaluation.tables.measured_rows``)."""
        scored = [(r.dataset, r.condition, r.model, r.variant, q) for r in self.scored for q in r.qsets]
        pairs = [(r.dataset, f"{r.reference}_vs_{r.other}", r.model, r.variant, q)
                 for r in self.consistency for q in r.qsets]
        return scored + pairs

    def _groups(self, models: list[str]) -> list[Group]:
        groups: dict[tuple, list[str]] = {}
        for d in self.datasets:
            for c in self.dataset_conditions(d):
                for m in models:
                    for v in self.variants_under(m, c, d):
                        sets = tuple(self.run_qsets(d, c, m, v))
                        if sets:
                            groups.setdefault((d, c, sets, v), []).append(m)
        return [Group(d, c, list(sets), members, v) for (d, c, sets, v), members in groups.items()]

    @property
    def merge_groups(self) -> list[Group]:
        """One merge rule each (rules/inference.smk); one variant per group, so two never claim the same run."""
        return self._once("merge_groups", lambda: self._groups(self.models))

    @property
    def ensemble_groups(self) -> list[Group]:
        """One vote rule each (rules/ensembles.smk)."""
        return self._once("ensemble_groups", lambda: self._groups(list(self.ensembles)))

    def _once(self, key: str, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    # ---- what a job's answers depend on ------------------------------------------------------------------
    def model_settings(self, model: str) -> dict:
        """What a model's answers depend on: its entry without the keys that plan or label its runs
        (``verbmirage.models.registry.PLANNING_KEYS``)."""
        return {k: v for k, v in self.config["models"][model].items() if k not in MODEL_PLANNING_KEYS}

    def run_variant_settings(self, variant: str, model: str) -> dict:
        """What a variant's answers depend on as ``model`` runs it (its ``variant_settings`` on top), without
        the labels (:data:`LABEL_KEYS`)."""
        return {k: v for k, v in model_variant_entry(self.config, model, variant).items() if k not in LABEL_KEYS}

    def condition_settings(self, condition: str) -> dict:
        """What a condition's images and answers depend on: its entry without ``qsets``."""
        return image_settings(self.config["conditions"][condition])

    def batch_size(self, model: str) -> int:
        return self.config["models"][model].get("batch_size", self.config["inference"]["batch_size"])

    def n_shards(self, model: str) -> int:
        return self.config["models"][model].get("shards", self.config["inference"]["shards"])

    def model_resource(self, model: str, key: str, default):
        """A resource of a model's jobs, from its entry's ``resources``."""
        return self.config["models"][model].get("resources", {}).get(key, default)

    def derive_base_settings(self, base: str) -> dict:
        """The base entry a build loads: what its weights and prompts depend on, without planning keys and its
        own shards and batch size, so that only a change of these settings rebuilds."""
        return {k: v for k, v in self.model_settings(base).items() if k not in ("shards", "batch_size")}

    # ---- the data a run reads ------------------------------------------------------------------------------
    @property
    def hico_root(self) -> str:
        return self.config["datasets"]["hico"]["root"]

    @property
    def hico_det_root(self) -> str:
        """"" -> no boxes, no image subsets."""
        return self.config["datasets"]["hico"].get("det_root", "")

    @property
    def downloads(self) -> dict:
        return self.config["downloads"]

    def produced_by_download(self, root: str) -> str | None:
        """The flag of the download whose folder holds ``root``, or None."""
        for name in self.downloads:
            folder = Path(P.DOWNLOADED.format(download=name))
            if Path(root) == folder or folder in Path(root).parents:
                return P.DOWNLOAD_DONE.format(download=name)
        return None

    @property
    def hico_anno(self) -> str:
        """What HICO jobs wait for: the labels, or the download that brings them."""
        return self.produced_by_download(self.hico_root) or P.hico_annotations(self.hico_root)

    @property
    def hico_images(self) -> str:
        return self.produced_by_download(self.hico_root) or P.hico_images(self.hico_root)

    @property
    def hico_det_boxes(self) -> str | list:
        """The HICO-DET file the tags are computed from (anno_bbox.mat or instances_test2015.json), or what
        makes it; none without ``det_root``."""
        root = self.hico_det_root
        if not root:
            return []
        if Path(root) == Path(P.DEMO_HICO_DET_ROOT):
            return P.DEMO_HICO_FILES["bbox"]
        return self.produced_by_download(root) or str(hico_det_file(root) or P.hico_det_boxes(root))

    @property
    def charades_root(self) -> str:
        return self.charades["root"] if self.charades else ""

    @property
    def charades_split(self) -> str:
        return self.charades["split"] if self.charades else "test"

    @property
    def charades_csv(self) -> str:
        return (self.produced_by_download(self.charades_root)
                or P.charades_annotations(self.charades_root, self.charades_split))

    @property
    def charades_video_folder(self) -> str:
        if not self.charades:
            return ""
        return self.charades.get("videos") or P.charades_videos(self.charades_root)

    @property
    def charades_videos(self) -> str:
        return self.produced_by_download(self.charades_video_folder) or self.charades_video_folder

    @property
    def pangea(self) -> dict | None:
        """``datasets.pangea``: the training questions of a fine-tune that names no ``questions`` table."""
        return self.config["datasets"].get("pangea")

    @property
    def pangea_root(self) -> str:
        return self.pangea["root"] if self.pangea else ""

    @property
    def pangea_files(self) -> dict[str, str]:
        if not self.pangea:
            return {}
        made = self.produced_by_download(self.pangea_root)
        return {key: made or f"{self.pangea_root}/{self.pangea[key]}" for key in PANGEA_FILE_KEYS}

    @property
    def pangea_images(self) -> str:
        """Pangea's image folder, or the download that brings it."""
        if not self.pangea:
            return ""
        return self.produced_by_download(self.pangea_root) or self.pangea_image_root

    @property
    def pangea_image_root(self) -> str:
        """Pangea's image folder (what a build reads)."""
        return f"{self.pangea_root}/{self.pangea['images']}" if self.pangea else ""

    def identity(self, *parts: str) -> dict:
        """The ``identity`` param of a job that reads the named parts of a dataset (``verbmirage.data.identity``):
        root, content digests of the annotation files, listings of the image and video folders."""
        compute = {
            "hico_annotations": lambda: data_identity.hico_annotations(self.hico_root),
            "hico_images": lambda: data_identity.hico_images(self.hico_root),
            "hico_boxes": lambda: data_identity.hico_boxes(self.hico_det_root),
            "charadesego": lambda: data_identity.charades(self.charades_root, self.charades_video_folder),
            "pangea": lambda: data_identity.pangea(self.pangea, PANGEA_FILE_KEYS),
        }
        return {part: compute[part]() for part in parts}

    def image_identity(self, dataset: str) -> dict:
        """An image condition's source: HICO's image folder (CharadesEgo's frames are built by the workflow)."""
        return self.identity("hico_images") if dataset == "hico" else {}

    def image_source(self, dataset: str) -> str:
        """The folder a dataset's question images live in (or what produces it)."""
        return self.hico_images if dataset == "hico" else self.paths.charades_frames

    def image_root(self, dataset: str) -> str:
        return self.hico_root if dataset == "hico" else self.paths.charades_frames

    # ---- per-job inputs ----------------------------------------------------------------------------------------
    def questions(self, dataset: str, qsets) -> list[str]:
        """The question tables of ``qsets``, in that order."""
        return [self.paths.questions.format(dataset=dataset, qset=q) for q in qsets]

    def dataset_questions(self, dataset: str) -> list[str]:
        return self.questions(dataset, self.dataset_qsets[dataset])

    def predictions(self, dataset: str, qsets, condition: str, model: str, variant: str) -> list[str]:
        """The prediction tables of one run's ``qsets``, in that order."""
        return [self.paths.predictions.format(dataset=dataset, qset=q, condition=condition, model=model,
                                              variant=variant) for q in qsets]

    def run_shards(self, dataset: str, condition: str, model: str, variant: str) -> list[str]:
        """The output folders of a run's inference jobs (one per image shard)."""
        return [self.paths.suite_shard.format(dataset=dataset, condition=condition, model=model, variant=variant,
                                              shard=shard) for shard in range(self.n_shards(model))]

    def partial_images(self, dataset: str, condition: str) -> str | list:
        """A box condition's folder (crop): its manifest names the images, so the questions, it covers; none
        for the other conditions."""
        if condition not in self.box_conditions:
            return []
        return self.paths.condition_images.format(dataset=dataset, condition=condition)

    def pair_partial_images(self, dataset: str, reference: str, other: str) -> list[str]:
        """The folders of the box conditions of an error-consistency pair (their questions are the shared ones)."""
        return [self.paths.condition_images.format(dataset=dataset, condition=c)
                for c in (reference, other) if c in self.box_conditions]

    def condition_tags(self, condition: str) -> str | list:
        """The image tags a box condition takes its single-instance union boxes from."""
        return self.paths.image_tags if condition in self.box_conditions else []

    def metric_tags(self, dataset: str) -> str | list:
        """The tags a HICO metric job turns into image subsets; none without boxes or for other datasets."""
        return self.paths.image_tags if dataset == "hico" and self.hico_det_root else []

    def model_files(self, entry: dict) -> list[str]:
        """The folders of a model entry that the workflow builds (tiny models, derived models) or that hold its
        LoRA ``adapter``: inputs of every job that loads it."""
        path = entry.get("path", "")
        built = [P.TINY_MODEL.format(family=family) for family in TINY_BUILDERS] + self.derived_models
        return ([path] if path in built else []) + ([entry["adapter"]] if entry.get("adapter") else [])

    # ---- derived models (rules/derived.smk, rules/finetune.smk) --------------------------------------------
    @property
    def derived_models(self) -> list[str]:
        """The folder each derived model is built into: built even when no run asks the model (rule all)."""
        return [self.paths.derived_model.format(model=slug) for slug in self.derived]

    @property
    def pangea_finetunes(self) -> list[str]:
        """The fine-tunes that train on Pangea questions built for them (no ``questions`` table of their own)."""
        return [slug for slug, derive in self.derived.items()
                if derive["method"] == "lora_finetune" and not derive.get("questions")]

    @property
    def finetune_outputs(self) -> list[str]:
        return [path.format(model=slug) for slug in self.pangea_finetunes
                for path in (self.paths.training_questions, self.paths.training_sources, self.paths.training_summary)]

    def derive_files(self, derive: dict) -> tuple[dict, dict]:
        """(input files of rule derive_model, the paths its build reads as ``inputs``) of a derive block: one
        branch per method (``models.<slug>.derive.method``)."""
        if derive["method"] == "nullu":
            # Nullu's pairs: a LURE-format file (images under ``image_root``), else HICO's training labels, images
            if derive.get("pairs_file"):
                files = {"pairs_file": derive["pairs_file"]}
                return files, {**files, "image_root": derive.get("image_root", "")}
            return {"anno": self.hico_anno, "images": self.hico_images}, {"hico_root": self.hico_root}
        # lora_finetune: its `questions` table and `images` folder, else the Pangea questions built for it and
        # Pangea's images. A Pangea table depends on the derive block only, so equal blocks share the first's.
        if derive.get("questions"):
            return ({"questions": derive["questions"], "train_images": derive["images"]},
                    {"questions": derive["questions"], "images": derive["images"]})
        slug = next(slug for slug, other in self.derived.items() if other == derive)
        table = self.paths.training_questions.format(model=slug)
        return ({"questions": table, "train_images": self.pangea_images},
                {"questions": table, "images": self.pangea_image_root})

    def derive_inputs(self, model: str) -> dict:
        """A derived model's inputs: its base's built folders (tiny model, adapter) and its method's data."""
        derive = self.derived[model]
        base_files = self.model_files(self.config["models"][derive["base"]])
        return {"base_files": base_files, **self.derive_files(derive)[0]}

    def derive_data(self, model: str) -> dict:
        """The paths a derived model's build reads (its ``inputs`` argument)."""
        return self.derive_files(self.derived[model])[1]

    def derive_identity(self, model: str) -> dict:
        """The data a derived model trains on: HICO (Nullu without a pairs file), Pangea (a fine-tune without its
        own questions); a user's pairs file or question table is tracked by its modification time only."""
        derive = self.derived[model]
        if derive["method"] == "nullu" and not derive.get("pairs_file"):
            return self.identity("hico_annotations", "hico_images")
        if derive["method"] == "lora_finetune" and not derive.get("questions"):
            return self.identity("pangea")
        return {}

    # ---- calibrated decisions (rules/decisions.smk) --------------------------------------------------------
    @property
    def decisions(self) -> dict:
        """Threshold / content_free variant slugs; the number of calibration images they share."""
        return self._once("decisions", lambda: decision_plan(self.config))

    def calibration_qsets(self, dataset: str, condition: str, model: str, variant: str | None = None) -> list[str]:
        """The sets a threshold run fits a cut for: the HICO YN sets it asks (MC and CharadesEgo keep plain
        decisions)."""
        return calibration_qsets(dataset, [q for q in self.dataset_qsets[dataset]
                                           if self.asks(dataset, condition, q, model, variant)])

    @property
    def calibration_runs(self) -> list[CalibrationRun]:
        """Every threshold run with a calibration set (one cuts file each)."""
        return self._once("calibration_runs", self._calibration_runs)

    def _calibration_runs(self) -> list[CalibrationRun]:
        runs = []
        for m in self.models:
            for d in self.datasets:
                for c in self.dataset_conditions(d):
                    for v in [v for v in self.variants_under(m, c, d) if v in self.decisions["threshold"]]:
                        if not self.calibration_qsets(d, c, m, v):
                            continue
                        if c in self.box_conditions:
                            raise ValueError(
                                f"conditions.{c}.qsets: model '{m}' with threshold variant '{v}' asks YN sets "
                                f"under '{c}', but its training images have no HICO-DET boxes to calibrate on; "
                                f"ask only MC sets under '{c}', or list models.{m}.variants without '{v}'"
                            )
                        runs.append(CalibrationRun(d, c, m, v))
        return runs

    def calibration_tables(self, dataset: str, condition: str, model: str, variant: str) -> list[str]:
        """The calibration tables one threshold run asks, in :meth:`calibration_qsets` order."""
        return [self.paths.calibration_questions.format(dataset=dataset, qset=q)
                for q in self.calibration_qsets(dataset, condition, model, variant)]

    def calibration_condition_tables(self, dataset: str, condition: str) -> list[str]:
        """Every calibration table asked under a condition (its images folder covers them all)."""
        qsets = {q for run in self.calibration_runs if (run.dataset, run.condition) == (dataset, condition)
                 for q in self.calibration_qsets(run.dataset, run.condition, run.model, run.variant)}
        return [self.paths.calibration_questions.format(dataset=dataset, qset=q) for q in sorted(qsets)]

    def decision_input(self, dataset: str, condition: str, model: str, variant: str) -> str | list:
        """What a prediction job decides by: its run's cuts (threshold; none for a run without a calibration
        set) or the content-free images (content_free); nothing for the other variants."""
        if variant in self.decisions["threshold"]:
            run = CalibrationRun(dataset, condition, model, variant)
            return self.paths.calibration_cuts.format(**asdict(run)) if run in self.calibration_runs else []
        if variant in self.decisions["content_free"]:
            return self.paths.content_free_images.format(dataset="hico")  # HICO's, for every dataset
        return []

    @property
    def decision_outputs(self) -> list[str]:
        return [self.paths.calibration_cuts.format(**asdict(run)) for run in self.calibration_runs]

    # ---- metrics and the paper's tables (rules/metrics.smk, rules/tables.smk) ------------------------------
    @property
    def metric_parts(self) -> list[str]:
        """What rule metrics collects: every scored run's and consistency pair's part, then the analyses'."""
        p = self.paths
        return ([p.metric_part.format(**{**asdict(r), "qsets": None}) for r in self.scored]
                + [p.consistency_part.format(**asdict(r)) for r in self.consistency]
                + self.reliance_metric_parts + self.uncertainty_metric_parts + self.known_object_metric_parts)

    @property
    def table_numbers(self) -> list[int]:
        return [1, 2, 3] + ([4] if self.charades else [])

    @property
    def tables(self) -> list[str]:
        """Tables 1-4 as Parquet and Markdown (their HTML: :attr:`tables_html`)."""
        return [self.paths.table(n, ext) for n in self.table_numbers for ext in ("parquet", "md")]

    @property
    def tables_html(self) -> list[str]:
        return [self.paths.table(n, "html") for n in self.table_numbers]

    @property
    def question_counts(self) -> list[str]:
        return [self.paths.question_counts(ext).format(dataset=d) for d in self.datasets for ext in ("parquet", "md")]

    @property
    def paper_names(self) -> dict[str, str]:
        """slug -> the paper's model name: ``models.<slug>.paper_name``; an ensemble of the paper's three
        members is its ensemble."""
        return self._once("paper_names", lambda: paper_names_from_config(self.config))

    @property
    def variant_paper_names(self) -> dict[str, str]:
        return {v: s.get("paper_name", "") for v, s in self.config["variants"].items()}

    @property
    def paper_methods(self) -> dict[str, str]:
        """slug -> its Table 5 row (``models.<slug>.paper_method``); an unknown name stops the plan here."""
        return self._once("paper_methods", lambda: paper_methods_from_config(self.config, self.derived))

    @property
    def method_pairs(self) -> dict[str, str]:
        """slug -> LLaVA-1.5-7B where its Table 5 row is the paper's method on the paper's model."""
        return self._once("method_pairs", lambda: paper_method_pairs(self.config, self.paper_methods, self.derived))

    @property
    def mitigation_tables(self) -> dict[int, list[str]]:
        """Tables 5 and 8 as Parquet, Markdown and HTML."""
        return {n: self.paths.tables(n) for n in (5, 8)}

    # ---- attention (rules/analysis.smk; analysis.attention) ------------------------------------------------
    @property
    def attention_settings(self) -> dict:
        return self.config.get("analysis", {}).get("attention") or {}

    @property
    def attention_models(self) -> dict[str, dict]:
        """slug -> model entry (``models:`` or ``analysis.attention.extra_models``)."""
        return self._once("attention_models", lambda: attention_models(self.config))

    @property
    def attention_qsets(self) -> list[str]:
        return self.attention_settings.get("qsets", [])

    @property
    def attention_conditions(self) -> list[str]:
        return self.attention_settings.get("conditions", [])

    def attention_resource(self, model: str, key: str, default):
        return self.attention_models[model].get("resources", {}).get(key, default)

    @property
    def attention_parts(self) -> list[str]:
        return [self.paths.attention_part.format(dataset="hico", condition=c, model=m)
                for c in self.attention_conditions for m in self.attention_models]

    @property
    def attention_figures(self) -> dict[int, str]:
        return {n: self.paths.figure(f"fig{n}_attention") for n in (7, 8, 13, 14)}

    @property
    def attention_summary(self) -> list[str]:
        return [self.paths.analysis(f"attention_summary.{ext}") for ext in ("parquet", "html")]

    @property
    def attention_figure_roles(self) -> dict[int, str | None]:
        """Figure number -> model slug (``analysis.attention.figures``, else the paper's roles)."""
        backends = {slug: entry["backend"] for slug, entry in self.attention_models.items()}
        return figure_models(list(self.attention_models), backends, self.attention_settings.get("figures"))

    @property
    def attention_outputs(self) -> list[str]:
        if not self.attention_models:
            return []
        return [self.paths.analysis("attention.parquet"), *self.attention_summary, *self.attention_figures.values()]

    # ---- VCD divergence (rules/analysis.smk; on whenever a model runs a VCD variant) -----------------------
    @property
    def vcd_divergence_settings(self):
        return self._once("vcd_settings", lambda: vcd_divergence_settings(self.config))

    def _planned(self, run: dict, variant: str) -> bool:
        """Whether the workflow runs ``variant`` of the run's model, condition and set."""
        return (variant in self.variants_under(run["model"], run["condition"])
                and self.asks("hico", run["condition"], run["qset"], run["model"], variant))

    @property
    def vcd_divergence_runs(self) -> list[dict]:
        """Each VCD run read, with its plain counterpart's table (None: no flips, ``plain_note`` says why)."""
        return self._once("vcd_runs", self._vcd_divergence_runs)

    def _vcd_divergence_runs(self) -> list[dict]:
        found = divergence_runs(self.config, {m: self.model_variants[m] for m in self.models},
                                lambda condition, qset, model: self.asks("hico", condition, qset, model),
                                self.vcd_divergence_settings)
        found = [run if not run["plain_variant"] or self._planned(run, run["plain_variant"])
                 else {**run, "plain_variant": None, "plain_note": f"'{run['plain_variant']}' is not run on this set"}
                 for run in found]
        p = self.paths
        return [
            {**run,
             "questions": p.questions.format(dataset="hico", qset=run["qset"]),
             "predictions": p.predictions.format(dataset="hico", qset=run["qset"], condition=run["condition"],
                                                 model=run["model"], variant=run["variant"]),
             "plain": p.predictions.format(dataset="hico", qset=run["qset"], condition=run["condition"],
                                           model=run["model"], variant=run["plain_variant"])
             if run["plain_variant"] else None}
            for run in found
            if self._planned(run, run["variant"])
        ]

    @property
    def vcd_divergence_predictions(self) -> list[str]:
        """Every prediction table the analysis reads: the VCD runs and their plain counterparts."""
        runs = self.vcd_divergence_runs
        return sorted({run["predictions"] for run in runs} | {run["plain"] for run in runs if run["plain"]})

    @property
    def vcd_divergence_notes(self) -> dict[str, str]:
        return {run["model"]: "tiny model with RANDOM weights: KL and flips are noise, the figure only shows the "
                "layout" for run in self.vcd_divergence_runs if _is_tiny(self.config["models"][run["model"]])}

    @property
    def vcd_divergence_files(self) -> dict[str, str]:
        p = self.paths
        return {"table": p.analysis("vcd_divergence.parquet"), "html": p.analysis("vcd_divergence.html"),
                "hist": p.analysis("vcd_kl_hist.parquet"), "figure": p.figure("vcd_divergence")}

    @property
    def vcd_divergence_outputs(self) -> list[str]:
        return list(self.vcd_divergence_files.values()) if self.vcd_divergence_runs else []

    # ---- Known-Object mAP, Fig. 11 (rules/known_object.smk) ------------------------------------------------
    @property
    def known_object(self):
        """The checked ``analysis.known_object`` settings; None: off."""
        return self._once("known_object", lambda: known_object_settings(self.config))

    @property
    def known_object_params(self) -> dict:
        return asdict(self.known_object) if self.known_object else {}

    @property
    def known_object_figure(self) -> str:
        return self.paths.figure("fig11_known_object_ap")

    @property
    def known_object_metric_parts(self) -> list[str]:
        return [self.paths.analysis_metric_part("known_object")] if self.known_object else []

    @property
    def known_object_outputs(self) -> list[str]:
        return [self.paths.known_object_ap, self.known_object_figure] if self.known_object else []

    @property
    def known_object_questions(self) -> str | list:
        ko = self.known_object
        return self.paths.questions.format(dataset="hico", qset=ko.qset) if ko else []

    @property
    def known_object_runs(self) -> dict[str, str]:
        """"condition/model/variant" -> its prediction table."""
        ko = self.known_object
        if not ko:
            return {}
        return {f"{c}/{m}/{v}": self.paths.predictions.format(dataset="hico", qset=ko.qset, condition=c, model=m,
                                                              variant=v)
                for c in ko.conditions for m in ko.models for v in self.variants_under(m, c)
                if self.asks("hico", c, ko.qset, m, v)}

    @property
    def known_object_partial_images(self) -> dict[str, str]:
        """Crop conditions: only the questions on their images are ranked."""
        ko = self.known_object
        return {c: self.paths.condition_images.format(dataset="hico", condition=c)
                for c in ko.conditions if c in self.box_conditions} if ko else {}

    @property
    def known_object_model_entries(self) -> dict[str, dict]:
        """Backends mark the paper's numbers on Fig. 11; paths flag the tiny models."""
        ko = self.known_object
        return {m: self.config["models"].get(m, {"backend": "ensemble"}) for m in ko.models} if ko else {}

    # ---- token uncertainty and field of view (rules/uncertainty.smk) ---------------------------------------
    @property
    def uncertainty(self):
        """The ``analysis.uncertainty`` settings; None: off."""
        return self._once("uncertainty", lambda: uncertainty_settings(self.config))

    @property
    def token_models(self) -> list[str]:
        """Models whose ``confidence`` is an answer token's probability (not blind baselines, CLIP)."""
        return self._once("token_models",
                          lambda: token_probability_models({m: self.config["models"][m] for m in self.models}))

    @property
    def no_token_models(self) -> list[str]:
        return [m for m in self.models if m not in self.token_models]

    @property
    def uncertainty_models(self) -> list[str]:
        if not self.uncertainty:
            return []
        return [m for m in (self.uncertainty.models or self.models) if m in self.token_models]

    @property
    def uncertainty_skipped(self) -> list[str]:
        if not self.uncertainty:
            return []
        return [m for m in (self.uncertainty.models or self.models) if m in self.no_token_models]

    @property
    def fov(self):
        """The ``analysis.fov`` settings; None: off."""
        return self._once("fov", lambda: fov_settings(self.config, {c: self.condition_qsets("hico", c)
                                                                     for c in self.conditions}))

    @property
    def uncertainty_figures(self) -> dict[int, str]:
        return {n: self.paths.figure(f"fig{n}_uncertainty") for n in (9, 12)}

    @property
    def uncertainty_metric_parts(self) -> list[str]:
        return [self.paths.analysis_metric_part("uncertainty")] if self.uncertainty else []

    @property
    def fov_files(self) -> dict[str, str]:
        p = self.paths
        return {"summary": p.analysis("fov.parquet"), "rows": p.analysis("fov_rows.parquet"),  # Fig. 10's boxes
                **{ext: p.fov_table(ext) for ext in P.TABLE_FORMATS}, "figure": p.figure("fig10_fov")}

    @property
    def uncertainty_outputs(self) -> list[str]:
        f = self.fov_files
        return (([self.paths.analysis("uncertainty_hist.parquet"), *self.uncertainty_figures.values()]
                 if self.uncertainty else [])
                + ([f["summary"], f["figure"], f["parquet"], f["md"], f["html"]] if self.fov else []))

    @property
    def uncertainty_runs(self) -> list[dict]:
        """The prediction tables the histograms read: each configured set asked under each configured condition."""
        u = self.uncertainty
        if not u:
            return []
        p = self.paths
        return [{"model": m, "variant": v, "condition": c, "qset": q,
                 "questions": p.questions.format(dataset="hico", qset=q),
                 "predictions": p.predictions.format(dataset="hico", qset=q, condition=c, model=m, variant=v)}
                for c in u.conditions for q in u.qsets for m in self.uncertainty_models
                for v in self.variants_under(m, c) if self.asks("hico", c, q, m, v)]

    @property
    def fov_runs(self) -> list[dict]:
        """Per (model, variant, FOV set): its questions and its prediction table under every FOV condition."""
        fov = self.fov
        if not fov:
            return []
        p = self.paths
        return [{"model": m, "variant": v, "qset": q, "questions": p.questions.format(dataset="hico", qset=q),
                 "predictions": {c: p.predictions.format(dataset="hico", qset=q, condition=c, model=m, variant=v)
                                 for c in fov.conditions}}
                for q in fov.qsets for m in self.models for v in self.model_variants[m]
                if all(v in self.variants_under(m, c) and self.asks("hico", c, q, m, v) for c in fov.conditions)]

    @property
    def model_backends(self) -> dict[str, str]:
        return {slug: entry["backend"] for slug, entry in self.config["models"].items()}

    @property
    def random_weight_notes(self) -> dict[str, str]:
        """A note for the figures of the tiny demo models: their weights are random, their u is noise."""
        return {slug: "tiny model with RANDOM weights: u is noise, the figure only shows the layout"
                for slug, entry in self.config["models"].items() if _is_tiny(entry)}

    # ---- the paper's Figs. 1, 3, 4(b), 5, 6 (rules/figures.smk) --------------------------------------------
    @property
    def paper_figure_pair(self) -> tuple[str, str] | None:
        """Fig. 4(b): the noise pair of Table 2 (the first pair with a salt-and-pepper condition)."""
        pairs = self.consistency_pairs
        return next((pair for pair in pairs if self.config["conditions"][pair[1]]["type"] == "saltpepper"),
                    pairs[0] if pairs else None)

    @property
    def paper_figures(self) -> dict[str, str]:
        """Fig. 4(b) needs a consistency pair, Fig. 5 CharadesEgo, Fig. 6 the HICO-DET tags."""
        wanted = {"fig1": True, "fig3": True, "fig4b": bool(self.paper_figure_pair), "fig5": bool(self.charades),
                  "fig6": bool(self.hico_det_root)}
        return {name: self.paths.paper_figure(name) for name, on in wanted.items() if on}

    @property
    def paper_figure_decoding(self) -> str:
        """How the legend names the bars' decoding (the first variant's): the paper's name, else greedy, ..."""
        return variant_decoding(self.config["variants"][self.variants[0]])

    # ---- object reliance: Fig. 15, Tables 6 and 7 (rules/reliance.smk) -------------------------------------
    @property
    def reliance(self) -> dict | None:
        """None when ``analysis.object_reliance`` is absent; checked, defaults resolved."""
        return self._once("reliance", lambda: reliance_plan(self.config))

    @property
    def reliance_qsets(self) -> list[str]:
        """The four verb and object sets the analysis reads."""
        return list(RELIANCE_QSETS)

    @property
    def reliance_models(self) -> list[str]:
        return self.reliance["models"] if self.reliance else []

    @property
    def reliance_settings(self) -> dict:
        """The config block (schema defaults filled) with models, condition, variant, figure_model resolved."""
        if not self.reliance:
            return {}
        return {**self.config["analysis"]["object_reliance"],
                **{k: v for k, v in self.reliance.items() if k != "settings"}}

    @property
    def reliance_files(self) -> dict[str, str]:
        p = self.paths
        return {"objects": p.analysis("object_reliance.parquet"), "verbs": p.analysis("verb_influence.parquet"),
                "metrics": p.analysis_metric_part("object_reliance"), "figure": p.figure("fig15_object_reliance")}

    @property
    def reliance_metric_parts(self) -> list[str]:
        return [self.reliance_files["metrics"]] if self.reliance else []

    @property
    def reliance_outputs(self) -> list[str]:
        if not self.reliance:
            return []
        return [*self.paths.tables(6), *self.paths.tables(7), self.reliance_files["figure"]]

    @property
    def reliance_prediction_keys(self) -> list[list[str]]:
        """[model, qset] of every prediction table the analysis reads, in input order."""
        return [[m, q] for m in self.reliance_models for q in RELIANCE_QSETS]

    @property
    def reliance_predictions(self) -> list[str]:
        s = self.reliance_settings
        return [self.paths.predictions.format(dataset="hico", qset=q, condition=s["condition"], model=m,
                                              variant=s["variant"]) for m, q in self.reliance_prediction_keys]

    @property
    def reliance_questions(self) -> list[str]:
        return self.questions("hico", self.reliance_qsets) if self.reliance else []

    @property
    def reliance_condition_images(self) -> str | list:
        """A box condition's folder (its questions are those on its images); none for clean."""
        condition = self.reliance_settings.get("condition")
        return self.partial_images("hico", condition) if condition else []

    @property
    def reliance_figure_notes(self) -> dict[str, str]:
        """Fig. 15's note for a tiny demo model (random weights) or a model standing in for mPLUG-Owl2."""
        notes = {}
        for slug in self.reliance_models:
            entry = self.config["models"].get(slug, {})
            lines = []
            if _is_tiny(entry):
                lines.append("tiny model with RANDOM weights: the deltas are noise, the figure only shows the layout")
            if entry.get("backend") != "mplug_owl2":
                lines.append("stands in for the paper's mPLUG-Owl2")
            notes[slug] = "; ".join(lines)
        return notes

    # ---- rule all ------------------------------------------------------------------------------------------
    @property
    def targets(self) -> list[str]:
        """Rule all's inputs: everything a run of this config makes, in the order the end-of-run summary reads."""
        mitigation = [path for paths in self.mitigation_tables.values() for path in paths]
        return [self.paths.metrics, *self.tables, *self.tables_html, *mitigation, *self.question_counts,
                *self.attention_outputs, *self.vcd_divergence_outputs, *self.known_object_outputs,
                *self.uncertainty_outputs, *self.reliance_outputs, *self.paper_figures.values(),
                *self.decision_outputs, *self.derived_models, *self.finetune_outputs]

    def wildcard_constraints(self) -> dict[str, str]:
        """The workflow's global wildcard constraints: each wildcard matches one configured slug."""
        conditions = alternatives(self.conditions)
        return {
            "dataset": alternatives(self.datasets),
            "download": alternatives(self.downloads),
            "qset": alternatives(self.qsets + list(CHARADES_QUESTION_SETS)),
            "condition": conditions,
            "reference": conditions,
            "other": conditions,
            "variant": alternatives(self.variants),
            "shard": r"\d+",
        }
