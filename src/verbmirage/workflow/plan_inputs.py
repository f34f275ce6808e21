"""What the run plan's jobs read besides the runs' own tables and data (:mod:`verbmirage.workflow.plan_data`), as
two collaborators of :class:`verbmirage.workflow.plan.Plan`: the builds of models (:class:`ModelBuilds`: tiny and derived models, their inputs) and the calibrated decisions
(:class:`CalibrationPlan`: the calibration runs of threshold variants, what a prediction job decides by).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from verbmirage.benchmark.question_sets import calibration_qsets
from verbmirage.models.registry import TINY_FAMILIES as TINY_BUILDERS
from verbmirage.variants.settings import decision_plan
from verbmirage.workflow import paths as P
from verbmirage.workflow.paths import Paths
from verbmirage.workflow.plan_base import CalibrationRun, PlanFacts
from verbmirage.workflow.plan_data import DataInputs


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
