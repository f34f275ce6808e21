"""What the run plan's jobs read besides the runs' own tables, as three collaborators of
:class:`verbmirage.workflow.plan.Plan`: the data (:class:`DataInputs`: roots, files, dataset identities), the
builds of models (:class:`ModelBuilds`: tiny and derived models, their inputs) and the calibrated decisions
(:class:`CalibrationPlan`: the calibration runs of threshold variants, what a prediction job decides by).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path

from verbmirage.benchmark.question_sets import calibration_qsets
from verbmirage.data import identity as data_identity
from verbmirage.data.hico_files import hico_det_file
from verbmirage.models.registry import TINY_FAMILIES as TINY_BUILDERS
from verbmirage.variants.settings import decision_plan
from verbmirage.workflow import paths as P
from verbmirage.workflow.paths import Paths
from verbmirage.workflow.plan_base import PANGEA_FILE_KEYS, CalibrationRun, PlanFacts


@dataclass(repr=False)
class DataInputs:
    """The datasets' roots and files a job reads (or the download that brings them), and their identities
    (``datasets:``, ``downloads:``)."""

    config: dict
    paths: Paths

    # ---- HICO and HICO-DET ---------------------------------------------------------------------------------
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

    # ---- CharadesEgo (optional: Table 4) ---------------------------------------------------------------------
    @property
    def charades(self) -> dict | None:
        return self.config["datasets"].get("charadesego")

    @property
    def charades_root(self) -> str:
        return self.charades["root"] if self.charades else ""

    @property
    def charades_split(self) -> str:
        return self.charades["split"] if self.charades else "test"

    @property
    def charades_csv(self) -> str | list:
        """The annotation CSV the frames are cut by, or what makes it; none (an empty list, Snakemake's "no
        file") without ``datasets.charadesego``."""
        if not self.charades:
            return []
        return (self.produced_by_download(self.charades_root)
                or P.charades_annotations(self.charades_root, self.charades_split))

    @property
    def charades_video_folder(self) -> str:
        if not self.charades:
            return ""
        return self.charades.get("videos") or P.charades_videos(self.charades_root)

    @property
    def charades_videos(self) -> str | list:
        """The video folder, or what makes it; none without ``datasets.charadesego`` (as :attr:`charades_csv`)."""
        if not self.charades:
            return []
        return self.produced_by_download(self.charades_video_folder) or self.charades_video_folder

    # ---- Pangea (the training questions of a fine-tune) -------------------------------------------------------
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

    # ---- identities and image folders ------------------------------------------------------------------------
    def identity(self, *parts: str) -> dict:
        """The ``identity`` param of a job that reads the named parts of a dataset (``verbmirage.data.identity``):
        root, content digests of the annotation files, listings of the image and video folders."""
        compute = {
            "hico_annotations": lambda: data_identity.hico_annotations(self.hico_root),
            "hico_images": lambda: data_identity.hico_images(self.hico_root, self.content_versions),
            "hico_boxes": lambda: data_identity.hico_boxes(self.hico_det_root),
            "charadesego": lambda: data_identity.charades(self.charades_root, self.charades_video_folder,
                                                          self.content_versions),
            "pangea": lambda: data_identity.pangea(self.pangea, PANGEA_FILE_KEYS, self.content_versions),
        }
        return {part: compute[part]() for part in parts}

    @functools.cached_property
    def content_versions(self) -> data_identity.ContentVersions:
        """The content versions of the data's image and video files (one cache for every config)."""
        return data_identity.ContentVersions(P.CONTENT_CACHE)

    def image_identity(self, dataset: str) -> dict:
        """An image condition's source: HICO's image folder (CharadesEgo's frames are built by the workflow)."""
        return self.identity("hico_images") if dataset == "hico" else {}

    def image_source(self, dataset: str) -> str:
        """The folder a dataset's question images live in (or what produces it)."""
        return self.hico_images if dataset == "hico" else self.paths.charades_frames

    def image_root(self, dataset: str) -> str:
        return self.hico_root if dataset == "hico" else self.paths.charades_frames

    def frame_tables(self, dataset: str) -> list[str]:
        """The frame table a dataset's question counts read (CharadesEgo: how each ego frame's time was chosen);
        none for HICO."""
        return [self.paths.charades_frame_table] if dataset == "charadesego" else []


@dataclass(repr=False)
class ModelBuilds:
    """The models the workflow builds (tiny random-weight models, derived models: rules/data.smk,
    rules/derived.smk, rules/finetune.smk) and what each build reads."""

    config: dict  # the plan's: ``models`` with the derived entries resolved
    paths: Paths
    derived: dict[str, dict]  # slug -> its ``derive`` block
    data: DataInputs

    @property
    def tiny_families(self) -> list[str]:
        """The transformers families rule tiny_model builds a random-weight model of."""
        return list(TINY_BUILDERS)

    @property
    def derived_models(self) -> list[str]:
        """The folder each derived model is built into: built even when no run asks the model (rule all)."""
        return [self.paths.derived_model.format(model=slug) for slug in self.derived]

    def model_files(self, entry: dict) -> list[str]:
        """The folders of a model entry that the workflow builds (tiny models, derived models) or that hold its
        LoRA ``adapter``: inputs of every job that loads it."""
        path = entry.get("path", "")
        built = [P.TINY_MODEL.format(family=family) for family in TINY_BUILDERS] + self.derived_models
        return ([path] if path in built else []) + ([entry["adapter"]] if entry.get("adapter") else [])

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
        data = self.data
        if derive["method"] == "nullu":
            # Nullu's pairs: a LURE-format file (images under ``image_root``), else HICO's training labels, images
            if derive.get("pairs_file"):
                files = {"pairs_file": derive["pairs_file"]}
                return files, {**files, "image_root": derive.get("image_root", "")}
            return {"anno": data.hico_anno, "images": data.hico_images}, {"hico_root": data.hico_root}
        # lora_finetune: its `questions` table and `images` folder, else the Pangea questions built for it and
        # Pangea's images. A Pangea table depends on the derive block only, so equal blocks share the first's.
        if derive.get("questions"):
            return ({"questions": derive["questions"], "train_images": derive["images"]},
                    {"questions": derive["questions"], "images": derive["images"]})
        slug = next(slug for slug, other in self.derived.items() if other == derive)
        table = self.paths.training_questions.format(model=slug)
        return ({"questions": table, "train_images": data.pangea_images},
                {"questions": table, "images": data.pangea_image_root})

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
            return self.data.identity("hico_annotations", "hico_images")
        if derive["method"] == "lora_finetune" and not derive.get("questions"):
            return self.data.identity("pangea")
        return {}


@dataclass(repr=False)
class CalibrationPlan:
    """The calibrated decisions (rules/decisions.smk): which variants decide by a threshold or by content-free
    images, the threshold runs with a calibration set, and what a prediction job decides by."""

    plan: PlanFacts

    @functools.cached_property
    def decisions(self) -> dict:
        """Threshold / content_free variant slugs; the number of calibration images they share."""
        return decision_plan(self.plan.config)

    def qsets(self, dataset: str, condition: str, model: str, variant: str | None = None) -> list[str]:
        """The sets a threshold run fits a cut for: the HICO YN sets it asks (MC and CharadesEgo keep plain
        decisions)."""
        r = self.plan
        return calibration_qsets(dataset, [q for q in r.dataset_qsets[dataset]
                                           if r.asks(dataset, condition, q, model, variant)])

    @functools.cached_property
    def runs(self) -> list[CalibrationRun]:
        """Every threshold run with a calibration set (one cuts file each); a threshold run under a box
        condition stops the plan (its training images have no boxes to calibrate on)."""
        found, r = [], self.plan
        for m in r.models:
            for d in r.datasets:
                for c in r.dataset_conditions(d):
                    for v in [v for v in r.variants_under(m, c, d) if v in self.decisions["threshold"]]:
                        if not self.qsets(d, c, m, v):
                            continue
                        if c in r.box_conditions:
                            raise ValueError(
                                f"conditions.{c}.qsets: model '{m}' with threshold variant '{v}' asks YN sets "
                                f"under '{c}', but its training images have no HICO-DET boxes to calibrate on; "
                                f"ask only MC sets under '{c}', or list models.{m}.variants without '{v}'"
                            )
                        found.append(CalibrationRun(d, c, m, v))
        return found

    def tables(self, dataset: str, condition: str, model: str, variant: str) -> list[str]:
        """The calibration tables one threshold run asks, in :meth:`qsets` order."""
        return [self.plan.paths.calibration_questions.format(dataset=dataset, qset=q)
                for q in self.qsets(dataset, condition, model, variant)]

    def condition_tables(self, dataset: str, condition: str) -> list[str]:
        """Every calibration table asked under a condition (its images folder covers them all)."""
        qsets = {q for run in self.runs if (run.dataset, run.condition) == (dataset, condition)
                 for q in self.qsets(run.dataset, run.condition, run.model, run.variant)}
        return [self.plan.paths.calibration_questions.format(dataset=dataset, qset=q) for q in sorted(qsets)]

    def decision_input(self, dataset: str, condition: str, model: str, variant: str) -> str | list:
        """What a prediction job decides by: its run's cuts (threshold; none for a run without a calibration
        set) or the content-free images (content_free); nothing for the other variants."""
        paths = self.plan.paths
        if variant in self.decisions["threshold"]:
            run = CalibrationRun(dataset, condition, model, variant)
            return paths.calibration_cuts.format(**asdict(run)) if run in self.runs else []
        if variant in self.decisions["content_free"]:
            return paths.content_free_images.format(dataset="hico")  # HICO's, for every dataset
        return []

    @property
    def outputs(self) -> list[str]:
        return [self.plan.paths.calibration_cuts.format(**asdict(run)) for run in self.runs]
