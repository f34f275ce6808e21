"""What each analysis reads and writes, one collaborator of :class:`verbmirage.workflow.plan.Plan` per analysis:
attention, VCD divergence, Known-Object mAP, token uncertainty, field of view, object reliance. Each is built
from the plan's facts (:class:`~verbmirage.workflow.plan_base.PlanFacts`) and reads its settings from its analysis's
light ``*_settings`` module; one that is off (``settings`` None or empty) plans no job and no target.

To add an analysis: its settings reader in ``analysis/<name>_settings.py``, one class here, one line in
:class:`~verbmirage.workflow.plan.Plan` that builds it (and its outputs in ``Plan.targets``), its rules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property

from verbmirage.analysis.attention_settings import attention_models, figure_models
from verbmirage.analysis.figure_layout import part_names
from verbmirage.analysis.fov_settings import fov_pages, fov_settings
from verbmirage.analysis.known_object_settings import known_object_settings
from verbmirage.analysis.object_reliance_settings import RELIANCE_QSETS, reliance_plan
from verbmirage.analysis.uncertainty_settings import uncertainty_settings
from verbmirage.analysis.vcd_divergence_settings import divergence_runs, vcd_divergence_settings
from verbmirage.workflow import paths as P
from verbmirage.workflow.plan_base import PlanFacts
from verbmirage.workflow.plan_figures import FiguresPlan


def _prediction(plan: PlanFacts, qset: str, condition: str, model: str, variant: str) -> str:
    return plan.paths.predictions.format(dataset="hico", qset=qset, condition=condition, model=model, variant=variant)


@dataclass(repr=False)
class AttentionPlan:
    """Answer-position attention, Figs. 7, 8, 13, 14 (rules/analysis.smk; ``analysis.attention``)."""

    plan: PlanFacts

    @cached_property
    def settings(self) -> dict:
        return self.plan.config.get("analysis", {}).get("attention") or {}

    @cached_property
    def models(self) -> dict[str, dict]:
        """slug -> model entry (``models:`` or ``analysis.attention.extra_models``)."""
        return attention_models(self.plan.config)

    @property
    def qsets(self) -> list[str]:
        return self.settings.get("qsets", [])

    @property
    def conditions(self) -> list[str]:
        return self.settings.get("conditions", [])

    @property
    def figure_condition(self) -> str:
        """The condition the figures draw: the first configured, else clean."""
        return (self.conditions or ["clean"])[0]

    def resource(self, model: str, key: str, default):
        return self.models[model].get("resources", {}).get(key, default)

    @property
    def parts(self) -> list[str]:
        return [self.plan.paths.attention_part.format(dataset="hico", condition=c, model=m)
                for c in self.conditions for m in self.models]

    @property
    def figures(self) -> dict[int, str]:
        return {n: self.plan.paths.figure(f"fig{n}_attention") for n in (7, 8, 13, 14)}

    @property
    def summary(self) -> list[str]:
        return [self.plan.paths.analysis(f"attention_summary.{ext}") for ext in ("parquet", "html")]

    @property
    def figure_roles(self) -> dict[int, str | None]:
        """Figure number -> model slug (``analysis.attention.figures``, else the paper's roles)."""
        backends = {slug: entry["backend"] for slug, entry in self.models.items()}
        return figure_models(list(self.models), backends, self.settings.get("figures"))

    @property
    def outputs(self) -> list[str]:
        if not self.models:
            return []
        return [self.plan.paths.analysis("attention.parquet"), *self.summary, *self.figures.values()]


@dataclass(repr=False)
class VcdDivergencePlan:
    """VCD divergence (rules/analysis.smk): on whenever a model runs a VCD variant."""

    plan: PlanFacts

    @cached_property
    def settings(self):
        return vcd_divergence_settings(self.plan.config)

    def _planned(self, run: dict, variant: str) -> bool:
        """Whether the workflow runs ``variant`` of the run's model, condition and set."""
        return (variant in self.plan.variants_under(run["model"], run["condition"])
                and self.plan.asks("hico", run["condition"], run["qset"], run["model"], variant))

    @cached_property
    def runs(self) -> list[dict]:
        """Each VCD run read, with its plain counterpart's table (None: no flips, ``plain_note`` says why)."""
        r = self.plan
        found = divergence_runs(r.config, {m: r.model_variants[m] for m in r.models},
                                lambda condition, qset, model: r.asks("hico", condition, qset, model), self.settings)
        found = [run if not run["plain_variant"] or self._planned(run, run["plain_variant"])
                 else {**run, "plain_variant": None, "plain_note": f"'{run['plain_variant']}' is not run on this set"}
                 for run in found]
        return [
            {**run,
             "questions": r.paths.questions.format(dataset="hico", qset=run["qset"]),
             "predictions": _prediction(r, run["qset"], run["condition"], run["model"], run["variant"]),
             "plain": _prediction(r, run["qset"], run["condition"], run["model"], run["plain_variant"])
             if run["plain_variant"] else None}
            for run in found
            if self._planned(run, run["variant"])
        ]

    @property
    def questions(self) -> list[str]:
        return sorted({run["questions"] for run in self.runs})

    @property
    def predictions(self) -> list[str]:
        """Every prediction table the analysis reads: the VCD runs and their plain counterparts."""
        runs = self.runs
        return sorted({run["predictions"] for run in runs} | {run["plain"] for run in runs if run["plain"]})

    @property
    def notes(self) -> dict[str, str]:
        stand_ins = self.plan.stand_ins
        return {run["model"]: f"stand-in ({stand_ins[run['model']]}): KL and flips are not a model's, the "
                "figure only shows the layout" for run in self.runs if run["model"] in stand_ins}

    @property
    def files(self) -> dict[str, str]:
        p = self.plan.paths
        return {"table": p.analysis("vcd_divergence.parquet"), "html": p.analysis("vcd_divergence.html"),
                "hist": p.analysis("vcd_kl_hist.parquet"), "figure": p.figure("vcd_divergence")}

    @property
    def outputs(self) -> list[str]:
        return list(self.files.values()) if self.runs else []


@dataclass(repr=False)
class KnownObjectPlan:
    """Known-Object mAP, Fig. 11 (rules/known_object.smk; ``analysis.known_object``)."""

    plan: PlanFacts

    @cached_property
    def settings(self):
        """The checked ``analysis.known_object`` settings; None: off."""
        return known_object_settings(self.plan.config)

    @property
    def params(self) -> dict:
        return asdict(self.settings) if self.settings else {}

    @property
    def figure(self) -> str:
        return self.plan.paths.figure("fig11_known_object_ap")

    @property
    def metric_parts(self) -> list[str]:
        return [self.plan.paths.analysis_metric_part("known_object")] if self.settings else []

    @property
    def outputs(self) -> list[str]:
        return [self.plan.paths.known_object_ap, self.figure] if self.settings else []

    @property
    def questions(self) -> str | list:
        ko = self.settings
        return self.plan.paths.questions.format(dataset="hico", qset=ko.qset) if ko else []

    @property
    def runs(self) -> dict[str, str]:
        """"condition/model/variant" -> its prediction table."""
        ko, r = self.settings, self.plan
        if not ko:
            return {}
        return {f"{c}/{m}/{v}": _prediction(r, ko.qset, c, m, v)
                for c in ko.conditions for m in ko.models for v in r.variants_under(m, c)
                if r.asks("hico", c, ko.qset, m, v)}

    @property
    def partial_images(self) -> dict[str, str]:
        """Crop conditions: only the questions on their images are ranked."""
        ko = self.settings
        return {c: self.plan.paths.condition_images.format(dataset="hico", condition=c)
                for c in ko.conditions if c in self.plan.box_conditions} if ko else {}

    @property
    def model_entries(self) -> dict[str, dict]:
        """Backends mark the paper's numbers on Fig. 11; paths flag the tiny models."""
        ko = self.settings
        return {m: self.plan.config["models"].get(m, {"backend": "ensemble"}) for m in ko.models} if ko else {}


@dataclass(repr=False)
class UncertaintyPlan:
    """Token uncertainty, Figs. 9 and 12 (rules/uncertainty.smk; ``analysis.uncertainty``)."""

    plan: PlanFacts
    variant_choice: FiguresPlan

    @cached_property
    def settings(self):
        """The ``analysis.uncertainty`` settings; None: off."""
        return uncertainty_settings(self.plan.config)

    def _configured_models(self, with_token: bool) -> list[str]:
        if not self.settings:
            return []
        return [m for m in (self.settings.models or self.plan.models)
                if (m in self.plan.token_models) == with_token]

    @property
    def models(self) -> list[str]:
        """The configured models whose ``confidence`` is an answer token's probability."""
        return self._configured_models(True)

    @property
    def skipped(self) -> list[str]:
        """The configured models without one (named on the figures)."""
        return self._configured_models(False)

    @property
    def figures(self) -> dict[int, str]:
        return {n: self.plan.paths.figure(f"fig{n}_uncertainty") for n in (9, 12)}

    @property
    def figure_condition(self) -> str:
        """The condition the figures draw: the first configured."""
        return self.settings.conditions[0] if self.settings else "clean"

    @property
    def chosen_figures(self) -> dict:
        """``analysis.uncertainty.figures``: figure -> the model it draws."""
        return dict(self.settings.figures) if self.settings else {}

    @property
    def metric_parts(self) -> list[str]:
        return [self.plan.paths.analysis_metric_part("uncertainty")] if self.settings else []

    @property
    def outputs(self) -> list[str]:
        if not self.settings:
            return []
        return [self.plan.paths.analysis("uncertainty_hist.parquet"), *self.figures.values()]

    @property
    def runs(self) -> list[dict]:
        """The prediction tables the histograms read: each configured set asked under each configured condition."""
        u, r = self.settings, self.plan
        if not u:
            return []
        return [{"model": m, "variant": v, "condition": c, "qset": q,
                 "questions": r.paths.questions.format(dataset="hico", qset=q),
                 "predictions": _prediction(r, q, c, m, v)}
                for c in u.conditions for q in u.qsets for m in self.models
                for v in r.variants_under(m, c) if r.asks("hico", c, q, m, v)]

    @property
    def questions(self) -> list[str]:
        return sorted({run["questions"] for run in self.runs})

    @property
    def predictions(self) -> list[str]:
        return [run["predictions"] for run in self.runs]

    @property
    def figure_variants(self) -> dict[str, str]:
        """Figs. 9 and 12: model -> the variant drawn (:meth:`FiguresPlan.choose`), among those of its
        histogram rows under the condition the figures draw."""
        if not self.settings:
            return {}
        condition, runs = self.figure_condition, self.runs
        return self.variant_choice.choose({m: [v for v in self.plan.model_variants[m] if any(
            (run["model"], run["variant"], run["condition"]) == (m, v, condition) for run in runs)]
            for m in self.models})


@dataclass(repr=False)
class FovPlan:
    """Field of view, Fig. 10 and the FOV table (rules/uncertainty.smk; ``analysis.fov``)."""

    plan: PlanFacts
    variant_choice: FiguresPlan

    @cached_property
    def settings(self):
        """The ``analysis.fov`` settings; None: off."""
        r = self.plan
        return fov_settings(r.config, {c: r.condition_qsets("hico", c) for c in r.conditions})

    @property
    def qsets(self) -> list[str]:
        return self.settings.qsets if self.settings else []

    @property
    def conditions(self) -> dict[str, dict]:
        """The FOV conditions' entries (``conditions.<slug>``)."""
        return {c: self.plan.config["conditions"][c] for c in self.settings.conditions} if self.settings else {}

    @property
    def runs(self) -> list[dict]:
        """Per (model, variant, FOV set): its questions and its prediction table under every FOV condition."""
        fov, r = self.settings, self.plan
        if not fov:
            return []
        return [{"model": m, "variant": v, "qset": q, "questions": r.paths.questions.format(dataset="hico", qset=q),
                 "predictions": {c: _prediction(r, q, c, m, v) for c in fov.conditions}}
                for q in fov.qsets for m in r.models for v in r.model_variants[m]
                if all(v in r.variants_under(m, c) and r.asks("hico", c, q, m, v) for c in fov.conditions)]

    @property
    def questions(self) -> list[str]:
        return sorted({run["questions"] for run in self.runs})

    @property
    def predictions(self) -> list[str]:
        return [path for run in self.runs for path in run["predictions"].values()]

    @property
    def figure_models(self) -> list[str]:
        """Fig. 10's models: those with a token probability that the FOV analysis runs, in config order."""
        ran = {run["model"] for run in self.runs}
        return [m for m in self.plan.token_models if m in ran]

    @property
    def files(self) -> dict:
        """The FOV tables, Fig. 10's boxes (``rows``) and Fig. 10's pages (``figures``: ``fig10a_fov``, ...,
        :func:`~verbmirage.analysis.fov_settings.fov_pages`)."""
        p = self.plan.paths
        pages = fov_pages(self.figure_models, len(self.settings.qsets)) if self.settings else [[]]
        return {"summary": p.analysis("fov.parquet"), "rows": p.analysis("fov_rows.parquet"),  # Fig. 10's boxes
                **{ext: p.fov_table(ext) for ext in P.TABLE_FORMATS},
                "figures": [p.figure(name) for name in part_names("fig10_fov", len(pages))]}

    @property
    def outputs(self) -> list[str]:
        f = self.files
        return [f["summary"], *f["figures"], f["parquet"], f["md"], f["html"]] if self.settings else []

    @property
    def figure_variants(self) -> dict[str, str]:
        """Fig. 10: model -> the variant drawn (:meth:`FiguresPlan.choose`), among those it runs under every
        FOV condition."""
        runs = {(run["model"], run["variant"]) for run in self.runs}
        variants = self.plan.model_variants
        return self.variant_choice.choose({m: [v for v in variants[m] if (m, v) in runs]
                                           for m in self.plan.token_models}) if self.settings else {}


@dataclass(repr=False)
class ReliancePlan:
    """Object reliance: Fig. 15, Tables 6 and 7 (rules/reliance.smk; ``analysis.object_reliance``)."""

    plan: PlanFacts

    @cached_property
    def resolved(self) -> dict | None:
        """None when ``analysis.object_reliance`` is absent; checked, defaults resolved."""
        return reliance_plan(self.plan.config)

    @property
    def qsets(self) -> list[str]:
        """The four verb and object sets the analysis reads."""
        return list(RELIANCE_QSETS)

    @property
    def models(self) -> list[str]:
        return self.resolved["models"] if self.resolved else []

    @property
    def settings(self) -> dict:
        """The config block (schema defaults filled) with models, condition, variant, figure_model resolved."""
        if not self.resolved:
            return {}
        return {**self.plan.config["analysis"]["object_reliance"],
                **{k: v for k, v in self.resolved.items() if k != "settings"}}

    @property
    def files(self) -> dict[str, str]:
        p = self.plan.paths
        return {"objects": p.analysis("object_reliance.parquet"), "verbs": p.analysis("verb_influence.parquet"),
                "metrics": p.analysis_metric_part("object_reliance"), "figure": p.figure("fig15_object_reliance")}

    @property
    def metric_parts(self) -> list[str]:
        return [self.files["metrics"]] if self.resolved else []

    @property
    def outputs(self) -> list[str]:
        if not self.resolved:
            return []
        p = self.plan.paths
        return [*p.tables(6), *p.tables(7), self.files["figure"]]

    @property
    def prediction_keys(self) -> list[list[str]]:
        """[model, qset] of every prediction table the analysis reads, in input order."""
        return [[m, q] for m in self.models for q in RELIANCE_QSETS]

    @property
    def predictions(self) -> list[str]:
        s = self.settings
        return [_prediction(self.plan, q, s["condition"], m, s["variant"]) for m, q in self.prediction_keys]

    @property
    def questions(self) -> list[str]:
        return self.plan.questions("hico", self.qsets) if self.resolved else []

    @property
    def condition_images(self) -> str | list:
        """A box condition's folder (its questions are those on its images); none for clean."""
        condition = self.settings.get("condition")
        return self.plan.partial_images("hico", condition) if condition else []

    @property
    def figure_notes(self) -> dict[str, str]:
        """Fig. 15's note for a tiny demo model (random weights) or a model standing in for mPLUG-Owl2."""
        notes, stand_ins = {}, self.plan.stand_ins
        for slug in self.models:
            entry = self.plan.config["models"].get(slug, {})
            lines = []
            if slug in stand_ins:
                lines.append(f"stand-in ({stand_ins[slug]}): these deltas are not a model's result")
            if entry.get("backend") != "mplug_owl2":
                lines.append("drawn in place of the paper's mPLUG-Owl2")
            notes[slug] = "; ".join(lines)
        return notes
