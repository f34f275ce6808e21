"""What each analysis of the run plan reads and writes: attention, VCD divergence, Known-Object mAP,
uncertainty and field of view, object reliance, the paper's figures (a part of
:class:`verbmirage.workflow.plan.Plan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

from verbmirage.analysis.attention_settings import attention_models, figure_models
from verbmirage.analysis.figure_layout import part_names
from verbmirage.analysis.fov_settings import fov_pages, fov_settings
from verbmirage.analysis.known_object_settings import known_object_settings
from verbmirage.analysis.object_reliance_settings import RELIANCE_QSETS, reliance_plan
from verbmirage.analysis.uncertainty_settings import token_probability_models, uncertainty_settings
from verbmirage.analysis.vcd_divergence_settings import divergence_runs, vcd_divergence_settings
from verbmirage.core.errors import ConfigError
from verbmirage.evaluation.paper_numbers import PAPER_VARIANT
from verbmirage.workflow import paths as P


class AnalysesPlan:
    """The analyses' inputs and outputs of :class:`~verbmirage.workflow.plan.Plan` (it supplies ``config``,
    ``paths`` and the runs)."""

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
        return {run["model"]: f"stand-in ({self.stand_ins[run['model']]}): KL and flips are not a model's, the "
                "figure only shows the layout" for run in self.vcd_divergence_runs if run["model"] in self.stand_ins}

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
    def fov_figure_models(self) -> list[str]:
        """Fig. 10's models: those with a token probability that the FOV analysis runs, in config order."""
        ran = {run["model"] for run in self.fov_runs}
        return [m for m in self.token_models if m in ran]

    @property
    def fov_files(self) -> dict:
        """The FOV tables, Fig. 10's boxes (``rows``) and Fig. 10's pages (``figures``: ``fig10a_fov``, ...,
        :func:`~verbmirage.analysis.fov_settings.fov_pages`)."""
        p = self.paths
        pages = fov_pages(self.fov_figure_models, len(self.fov.qsets)) if self.fov else [[]]
        return {"summary": p.analysis("fov.parquet"), "rows": p.analysis("fov_rows.parquet"),  # Fig. 10's boxes
                **{ext: p.fov_table(ext) for ext in P.TABLE_FORMATS},
                "figures": [p.figure(name) for name in part_names("fig10_fov", len(pages))]}

    @property
    def uncertainty_outputs(self) -> list[str]:
        f = self.fov_files
        return (([self.paths.analysis("uncertainty_hist.parquet"), *self.uncertainty_figures.values()]
                 if self.uncertainty else [])
                + ([f["summary"], *f["figures"], f["parquet"], f["md"], f["html"]] if self.fov else []))

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
    def stand_in_notes(self) -> dict[str, str]:
        """A note for the figures of a stand-in (``models.<slug>.stand_in``: random weights, an oracle)."""
        return {slug: f"stand-in ({reason}): not a model's result" for slug, reason in self.stand_ins.items()}

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
        wanted = {"fig1": True, "fig3a": True, "fig3b": True, "fig4b": bool(self.paper_figure_pair),
                  "fig5": bool(self.charades), **dict.fromkeys(("fig6a", "fig6b", "fig6c"), bool(self.hico_det_root))}
        return {name: self.paths.paper_figure(name) for name, on in wanted.items() if on}

    @property
    def paper_figure_variants(self) -> dict[str, dict[str, str]]:
        """Figure (``fig1``, ...) -> model or ensemble -> the variant its bars draw (:meth:`figure_variants`), among
        the variants whose runs the figure reads: HICO under clean (Figs. 1, 3, 6), the noise pair of Fig. 4(b),
        CharadesEgo under clean (Fig. 5)."""
        return self._once("paper_figure_variants", self._paper_figure_variants)

    def _paper_figure_variants(self) -> dict[str, dict[str, str]]:
        scored = {(r.dataset, r.condition, r.model, r.variant) for r in self.scored}
        pairs = {(r.reference, r.other, r.model, r.variant) for r in self.consistency}

        def reads(figure: str, model: str, variant: str) -> bool:
            if figure == "fig4b":
                return (*self.paper_figure_pair, model, variant) in pairs
            return ("charadesego" if figure == "fig5" else "hico", "clean", model, variant) in scored

        models = self.models + list(self.ensembles)
        return {figure: self.figure_variants({m: [v for v in self.model_variants[m] if reads(figure, m, v)]
                                              for m in models})
                for figure in self.paper_figures}

    # ---- which variant each figure draws (analysis.figures; docs/analysis.md, "Which answers the figures draw") --
    @property
    def figure_settings(self) -> dict:
        """``analysis.figures``, checked: ``variant`` (None: the paper's decoding) and ``models`` (slug -> variant)."""
        return self._once("figure_settings", self._figure_settings)

    def _figure_settings(self) -> dict:
        where = "analysis.figures"
        block = self.config.get("analysis", {}).get("figures") or {}
        variant = block.get("variant")
        if variant is not None and variant not in self.variants:
            raise ConfigError(f"{where}.variant: '{variant}' is not a configured variant {self.variants}")
        chosen = dict(block.get("models") or {})
        for model, own in chosen.items():
            if model not in self.model_variants:
                raise ConfigError(f"{where}.models.{model}: '{model}' is neither in models: nor in ensembles:")
            if own not in self.model_variants[model]:
                raise ConfigError(f"{where}.models.{model}: '{own}' is not a variant it runs "
                                  f"{self.model_variants[model]}")
        return {"variant": variant, "models": chosen}

    def figure_variants(self, candidates: Mapping[str, list[str]]) -> dict[str, str]:
        """model -> the variant a figure draws of it, given ``candidates`` (model -> its variants whose runs the
        figure reads, in its variant order): ``analysis.figures.models.<slug>`` where set; else
        ``analysis.figures.variant`` where it is a candidate; else the candidate whose ``paper_name`` is the paper's
        decoding (beam 5, as the paper drew its figures: Appendix C); else the first candidate. A model without
        candidates (the figure has no bars of it) is named by the same rule over all its variants."""
        settings = self.figure_settings
        paper = [v for v, name in self.variant_paper_names.items() if name == PAPER_VARIANT]
        chosen = {}
        for model, found in candidates.items():
            pool = list(found) or self.model_variants[model]
            preferred = [v for v in (settings["variant"], *paper) if v in pool]
            chosen[model] = settings["models"].get(model) or (preferred + pool)[0]
        return chosen

    @property
    def uncertainty_figure_variants(self) -> dict[str, str]:
        """Figs. 9 and 12: model -> the variant drawn (:meth:`figure_variants`), among those of its histogram
        rows under the condition the figures draw."""
        if not self.uncertainty:
            return {}
        condition = self.uncertainty.conditions[0]
        return self.figure_variants({m: [v for v in self.model_variants[m] if any(
            (run["model"], run["variant"], run["condition"]) == (m, v, condition) for run in self.uncertainty_runs)]
            for m in self.uncertainty_models})

    @property
    def fov_figure_variants(self) -> dict[str, str]:
        """Fig. 10: model -> the variant drawn (:meth:`figure_variants`), among those it runs under every FOV
        condition."""
        runs = {(run["model"], run["variant"]) for run in self.fov_runs}
        return self.figure_variants({m: [v for v in self.model_variants[m] if (m, v) in runs]
                                     for m in self.token_models}) if self.fov else {}

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
            if slug in self.stand_ins:
                lines.append(f"stand-in ({self.stand_ins[slug]}): these deltas are not a model's result")
            if entry.get("backend") != "mplug_owl2":
                lines.append("drawn in place of the paper's mPLUG-Owl2")
            notes[slug] = "; ".join(lines)
        return notes
