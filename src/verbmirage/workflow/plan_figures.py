"""The paper's Figs. 1, 3, 4(b), 5, 6 (rules/figures.smk) and which variant each figure draws of a model
(``analysis.figures``; docs/analysis.md, "Which answers the figures draw"): a collaborator of
:class:`verbmirage.workflow.plan.Plan`, whose :meth:`FiguresPlan.choose` the uncertainty and FOV figures use too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from verbmirage.core.errors import ConfigError
from verbmirage.evaluation.paper_numbers import PAPER_VARIANT
from verbmirage.workflow.plan_base import PlanFacts


@dataclass(repr=False)
class FiguresPlan:
    """The paper figures a config draws, and the variant each figure draws of each model."""

    plan: PlanFacts

    @property
    def pair(self) -> tuple[str, str] | None:
        """Fig. 4(b): the noise pair of Table 2 (the first pair with a salt-and-pepper condition)."""
        pairs, conditions = self.plan.consistency_pairs, self.plan.config["conditions"]
        return next((pair for pair in pairs if conditions[pair[1]]["type"] == "saltpepper"),
                    pairs[0] if pairs else None)

    @property
    def files(self) -> dict[str, str]:
        """Fig. 4(b) needs a consistency pair, Fig. 5 CharadesEgo, Fig. 6 the HICO-DET tags."""
        data = self.plan.data
        wanted = {"fig1": True, "fig3a": True, "fig3b": True, "fig4b": bool(self.pair),
                  "fig5": bool(data.charades), **dict.fromkeys(("fig6a", "fig6b", "fig6c"), bool(data.hico_det_root))}
        return {name: self.plan.paths.paper_figure(name) for name, on in wanted.items() if on}

    @cached_property
    def variants(self) -> dict[str, dict[str, str]]:
        """Figure (``fig1``, ...) -> model or ensemble -> the variant its bars draw (:meth:`choose`), among the
        variants whose runs the figure reads: HICO under clean (Figs. 1, 3, 6), the noise pair of Fig. 4(b),
        CharadesEgo under clean (Fig. 5)."""
        p = self.plan
        scored = {(r.dataset, r.condition, r.model, r.variant) for r in p.scored}
        pairs = {(r.reference, r.other, r.model, r.variant) for r in p.consistency}

        def reads(figure: str, model: str, variant: str) -> bool:
            if figure == "fig4b":
                return (*self.pair, model, variant) in pairs
            return ("charadesego" if figure == "fig5" else "hico", "clean", model, variant) in scored

        models = p.models + list(p.ensembles)
        return {figure: self.choose({m: [v for v in p.model_variants[m] if reads(figure, m, v)] for m in models})
                for figure in self.files}

    @cached_property
    def settings(self) -> dict:
        """``analysis.figures``, checked: ``variant`` (None: the paper's decoding) and ``models`` (slug -> variant)."""
        where, p = "analysis.figures", self.plan
        block = p.config.get("analysis", {}).get("figures") or {}
        variant = block.get("variant")
        if variant is not None and variant not in p.variants:
            raise ConfigError(f"{where}.variant: '{variant}' is not a configured variant {p.variants}")
        chosen = dict(block.get("models") or {})
        for model, own in chosen.items():
            if model not in p.model_variants:
                raise ConfigError(f"{where}.models.{model}: '{model}' is neither in models: nor in ensembles:")
            if own not in p.model_variants[model]:
                raise ConfigError(f"{where}.models.{model}: '{own}' is not a variant it runs "
                                  f"{p.model_variants[model]}")
        return {"variant": variant, "models": chosen}

    def choose(self, candidates: Mapping[str, list[str]]) -> dict[str, str]:
        """model -> the variant a figure draws of it, given ``candidates`` (model -> its variants whose runs the
        figure reads, in its variant order): ``analysis.figures.models.<slug>`` where set; else
        ``analysis.figures.variant`` where it is a candidate; else the candidate whose ``paper_name`` is the paper's
        decoding (beam 5, as the paper drew its figures: Appendix C); else the first candidate. A model without
        candidates (the figure has no bars of it) is named by the same rule over all its variants."""
        settings = self.settings
        paper = [v for v, name in self.plan.variant_paper_names.items() if name == PAPER_VARIANT]
        chosen = {}
        for model, found in candidates.items():
            pool = list(found) or self.plan.model_variants[model]
            preferred = [v for v in (settings["variant"], *paper) if v in pool]
            chosen[model] = settings["models"].get(model) or (preferred + pool)[0]
        return chosen
