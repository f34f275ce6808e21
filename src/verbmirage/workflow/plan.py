"""The run plan: from the checked config, every run, group and input path the workflow's jobs need.

:meth:`Plan.from_config` reads a config that ``rules/common.smk`` has checked (``check_config``) and filled
with the schema's defaults, and decides:

- what runs: the datasets, their question sets, the conditions, the models (derived entries resolved) and the
  variants each runs (:meth:`Plan.variants_under`), and whether a run asks a set (:meth:`Plan.asks`);
- how the runs are grouped into jobs: one inference job per image shard of a run, one merge rule per group
  of runs asking the same sets (:attr:`Plan.merge_groups`), one vote rule per ensemble group, one metric job
  per scored run (:attr:`Plan.scored`), one consistency job per pair (:attr:`Plan.consistency`), one
  calibration job per threshold run (``Plan.calibration.runs``), one build per derived model;
- the paper's tables and rule ``all``'s targets (:attr:`Plan.targets`).

What the jobs read besides the runs' tables is planned by collaborators the plan builds from its facts
(:class:`~verbmirage.workflow.plan_base.PlanFacts`), one per concern, each reached as ``PLAN.<part>.<member>``
from the rules: the data (``data``) and the model builds (``builds``) in :mod:`.plan_inputs`, with the
calibrated decisions (``calibration``); the paper figures and the variant each figure draws (``figures``) in
:mod:`.plan_figures`; one per analysis (``attention``, ``vcd_divergence``, ``known_object``, ``uncertainty``,
``fov``, ``reliance``) in :mod:`.plan_analyses`.

Every path comes from :class:`verbmirage.workflow.paths.Paths`. Nothing here imports Snakemake: the rules'
input functions in ``rules/common.smk`` call these methods with their wildcards' values, and the tests
build the plan of any config directly. Per-analysis settings stay with their analysis
(``verbmirage.analysis.*_settings``) and are called from the analysis's collaborator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property

from verbmirage.analysis.uncertainty_settings import token_probability_models
from verbmirage.benchmark.condition_types import CONDITIONS as CONDITION_TYPES
from verbmirage.benchmark.condition_types import image_settings
from verbmirage.benchmark.question_sets import CHARADES_QUESTION_SETS
from verbmirage.evaluation.paper_methods import paper_method_pairs, paper_methods_from_config
from verbmirage.evaluation.paper_numbers import paper_names_from_config
from verbmirage.models.derived import derived_entries, effective_models
from verbmirage.models.entries import model_question_sets, model_variant_list, stand_ins
from verbmirage.models.registry import PLANNING_KEYS as MODEL_PLANNING_KEYS
from verbmirage.models.registry import backend_uses_images
from verbmirage.variants.settings import Variant, model_variant_entry
from verbmirage.workflow.config import condition_question_sets
from verbmirage.workflow.paths import Paths
from verbmirage.workflow.plan_analyses import (
    AttentionPlan,
    FovPlan,
    KnownObjectPlan,
    ReliancePlan,
    UncertaintyPlan,
    VcdDivergencePlan,
)
from verbmirage.workflow.plan_base import (
    LABEL_KEYS,
    CalibrationRun,
    Group,
    PairRun,
    Run,
    alternatives,
    figure_prints,
)
from verbmirage.workflow.plan_data import DataInputs
from verbmirage.workflow.plan_figures import FiguresPlan
from verbmirage.workflow.plan_inputs import CalibrationPlan, ModelBuilds
from verbmirage.workflow.report_items import is_reported
from verbmirage.workflow.run_folders import RunFolders

__all__ = ["CalibrationRun", "Group", "PairRun", "Plan", "Run", "alternatives", "figure_prints"]


@dataclass(repr=False)  # a config's whole plan: too long to print
class Plan:
    """Everything the workflow runs for one checked config, and every path it reads or writes: the runs and
    their jobs here; the data, the model builds, the calibrated decisions, the paper figures and each analysis
    in a collaborator built from the plan's facts (:class:`~verbmirage.workflow.plan_base.PlanFacts`):
    :attr:`data`, :attr:`builds`, :attr:`calibration`, :attr:`figures`, :attr:`attention`,
    :attr:`vcd_divergence`, :attr:`known_object`, :attr:`uncertainty`, :attr:`fov`, :attr:`reliance`."""

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
        (self.data.hico_det_boxes, self.paper_names, self.method_pairs, self.planned_cells, self.merge_groups,
         self.ensemble_groups, self.attention.models, self.vcd_divergence.runs, self.known_object.settings,
         self.uncertainty.settings, self.fov.settings, self.figures.variants, self.uncertainty.figure_variants,
         self.fov.figure_variants, self.reliance.resolved, self.calibration.runs)

    # ---- the collaborators -----------------------------------------------------------------------------------
    @cached_property
    def data(self) -> DataInputs:
        """The datasets' roots and files, and their identities."""
        return DataInputs(self.config, self.paths)

    @cached_property
    def builds(self) -> ModelBuilds:
        """The tiny and derived models the workflow builds, and what each build reads."""
        return ModelBuilds(self.config, self.paths, self.derived, self.data)

    @cached_property
    def calibration(self) -> CalibrationPlan:
        """The calibrated decisions: threshold runs, their calibration sets, what a prediction job decides by."""
        return CalibrationPlan(self)

    @cached_property
    def figures(self) -> FiguresPlan:
        """The paper's Figs. 1, 3-6, and the variant each figure draws of a model."""
        return FiguresPlan(self)

    @cached_property
    def attention(self) -> AttentionPlan:
        return AttentionPlan(self)

    @cached_property
    def vcd_divergence(self) -> VcdDivergencePlan:
        return VcdDivergencePlan(self)

    @cached_property
    def known_object(self) -> KnownObjectPlan:
        return KnownObjectPlan(self)

    @cached_property
    def uncertainty(self) -> UncertaintyPlan:
        return UncertaintyPlan(self, self.figures)

    @cached_property
    def fov(self) -> FovPlan:
        return FovPlan(self, self.figures)

    @cached_property
    def reliance(self) -> ReliancePlan:
        return ReliancePlan(self)

    # ---- what runs -------------------------------------------------------------------------------------------
    @property
    def qsets(self) -> list[str]:
        """HICO's question sets (``questions.sets``)."""
        return self.dataset_qsets["hico"]

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

    def batch_size(self, model: str) -> int | str:
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
        return self.paths.image_tags if dataset == "hico" and self.data.hico_det_root else []

    # ---- metrics and the paper's tables (rules/metrics.smk, rules/tables.smk) ------------------------------
    @property
    def metric_parts(self) -> list[str]:
        """What rule metrics collects: every scored run's and consistency pair's part, then the analyses'."""
        p = self.paths
        return ([p.metric_part.format(**{**asdict(r), "qsets": None}) for r in self.scored]
                + [p.consistency_part.format(**asdict(r)) for r in self.consistency]
                + self.reliance.metric_parts + self.uncertainty.metric_parts + self.known_object.metric_parts)

    @property
    def table_numbers(self) -> list[int]:
        return [1, 2, 3] + ([4] if self.data.charades else [])  # Table 4: CharadesEgo (ego vs exo)

    @property
    def tables(self) -> list[str]:
        """Tables 1-4 as Parquet and Markdown (their HTML: :attr:`tables_html`)."""
        return [self.paths.table(n, ext) for n in self.table_numbers for ext in ("parquet", "md")]

    @property
    def tables_html(self) -> list[str]:
        return [self.paths.table(n, "html") for n in self.table_numbers]

    @property
    def question_counts(self) -> list[str]:
        return [self.paths.question_counts(ext).format(dataset=d) for d in self.datasets
                for ext in ("parquet", "md", "html")]

    @property
    def report_pages(self) -> dict[str, str]:
        """The report's own pages (rule report_pages): the landing page's headline and the run's facts."""
        return {name: self.paths.report_page(f"{name}.html") for name in ("landing", "run_facts")}

    @property
    def report_files(self) -> list[str]:
        """Every file the HTML report shows: the outputs marked for it (tables, figures, the run's facts) and the
        landing page's headline. A report older than one of them is out of date (the end-of-run summary)."""
        return [path for path in self.targets if is_reported(path)] + [self.report_pages["landing"]]

    @property
    def stand_ins(self) -> dict[str, str]:
        """Model or ensemble -> why its rows are not a model's result (``models.<slug>.stand_in``)."""
        return self._once("stand_ins", lambda: stand_ins(self.config))

    @property
    def image_free_models(self) -> list[str]:
        """Models whose backend never looks at the image (blind baselines, the oracle), and ensembles of only such
        models: their answers agree under any image condition (Fig. 4(b) marks them)."""
        blind = [m for m in self.models if not backend_uses_images(self.config["models"][m]["backend"])]
        return blind + [e for e, members in self.ensembles.items() if set(members) <= set(blind)]

    @property
    def token_models(self) -> list[str]:
        """Models whose ``confidence`` is an answer token's probability (not blind baselines, CLIP)."""
        return self._once("token_models",
                          lambda: token_probability_models({m: self.config["models"][m] for m in self.models}))

    @property
    def no_token_models(self) -> list[str]:
        return [m for m in self.models if m not in self.token_models]

    @property
    def model_backends(self) -> dict[str, str]:
        return {slug: entry["backend"] for slug, entry in self.config["models"].items()}

    @property
    def stand_in_notes(self) -> dict[str, str]:
        """A note for the figures of a stand-in (``models.<slug>.stand_in``: random weights, an oracle)."""
        return {slug: f"stand-in ({reason}): not a model's result" for slug, reason in self.stand_ins.items()}

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

    # ---- rule all ------------------------------------------------------------------------------------------
    @property
    def targets(self) -> list[str]:
        """Rule all's inputs: everything a run of this config makes, in the order the end-of-run summary reads."""
        mitigation = [path for paths in self.mitigation_tables.values() for path in paths]
        return [self.paths.metrics, *self.tables, *self.tables_html, *mitigation, *self.question_counts,
                *self.report_pages.values(),
                *self.attention.outputs, *self.vcd_divergence.outputs, *self.known_object.outputs,
                *self.uncertainty.outputs, *self.fov.outputs, *self.reliance.outputs, *self.figures.files.values(),
                *self.calibration.outputs, *self.builds.derived_models, *self.builds.finetune_outputs]

    def wildcard_constraints(self) -> dict[str, str]:
        """The workflow's global wildcard constraints: each wildcard matches one configured slug."""
        conditions = alternatives(self.conditions)
        return {
            "dataset": alternatives(self.datasets),
            "download": alternatives(self.data.downloads),
            "qset": alternatives(self.qsets + list(CHARADES_QUESTION_SETS)),
            "condition": conditions,
            "reference": conditions,
            "other": conditions,
            "variant": alternatives(self.variants),
            "shard": r"\d+",
        }
