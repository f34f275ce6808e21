"""The paper's Figs. 1, 3, 4(b), 5 and 6, drawn from the long metrics table only.

Every figure is grouped bars, one group per model, one bar per quantity, in percent (kappa x100),
with the metric's bootstrap interval over images as an error bar. Where the paper's numbers
(:mod:`verbmirage.evaluation.paper_numbers`, the packaged ``paper_tables.csv``) have the quantity for the model a
group stands for (``models.<slug>.paper_name``; never a ``paper_method`` model, which is a method applied to a
model: the tables' one rule, ``paper_numbers.paper_names_from_config``), a black diamond marks it.

Each model's bars are one of its variants (``drawn``: model -> :class:`Drawn`; the run plan picks it per figure,
by default the variant whose ``paper_name`` is the paper's decoding, beam 5: ``analysis.figures``,
docs/analysis.md), and its mark is the paper's number for that decoding (the variant's ``paper_name``, else
``beam5``). The legend names the decoding on both sides: its title the bars' (the variant most models draw, then
each other with its models: "ours: beam5; default (greedy): molmo_7b_d"), the mark's entry the paper's, and
which models' bars differ from it (greedy bars beside a beam-5 mark are not like for like); the note under the
title says the same. A bar over fewer than 30
questions says how many ("n=12"). A combination the run did not ask (e.g. a set not run under noise) has no bar.
Every figure is laid out for a page and saved by :mod:`verbmirage.analysis.figure_layout`.

- Fig. 1: YN accuracy with (``yn_obj``) and without (``yn_verb``) object reference next to an
  object-hallucination score. The paper quotes POPE from the literature; ours is the accuracy on
  ``obj_exist`` (same images, in-domain), labelled "not POPE".
- Fig. 3, in two parts (``fig3a``, ``fig3b``): answer-No questions, rare vs non-rare HOIs (``yn_obj``) and
  common vs non-common verbs (``yn_verb``), the paper's figure; then the answer-Yes side (the recall of those
  subsets).
- Fig. 4(b): error consistency (Cohen's kappa of correctness) clean vs noisy images for object
  existence vs verbs.
- Fig. 5: CharadesEgo, egocentric vs exocentric views: MC circular accuracy (the paper's figure)
  and YN accuracy (its Table 4).
- Fig. 6, in three parts (``fig6a``-``fig6c``): ambiguous vs unambiguous images (HICO-DET tags): any rule
  (the paper's split), then one row per ambiguity rule, two rules a part.

Figs. 3 and 6 would be taller than a page in one piece, so each part is a figure of its own (its name the
figure's number and a letter, as :func:`~verbmirage.analysis.figure_layout.part_names` names parts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from verbmirage.analysis.figure_layout import (
    FONT,
    axis_width,
    columns_for,
    fit_title,
    legend_below,
    n_label,
    page_figure,
    page_style,
    save_figure,
    tick_rotation,
    wrap,
)
from verbmirage.evaluation.paper_numbers import PAPER_VARIANT, empty_paper_numbers, paper_value
from verbmirage.variants.settings import Variant

FIGURES = {
    "fig1": "Fig. 1: object vs verb hallucination",
    "fig3a": "Fig. 3, part a: rare and common verbs, correct answer No (the paper's figure)",
    "fig3b": "Fig. 3, part b: rare and common verbs, correct answer Yes (recall; ours)",
    "fig4b": "Fig. 4(b): error consistency, objects vs verbs",
    "fig5": "Fig. 5: egocentric vs exocentric views (CharadesEgo)",
    "fig6a": "Fig. 6, part a: ambiguous vs unambiguous images, any rule (the paper's split)",
    "fig6b": "Fig. 6, part b: ambiguous vs unambiguous images, by rule",
    "fig6c": "Fig. 6, part c: ambiguous vs unambiguous images, by rule",
}
AMBIGUITY_RULES = ("amb_size", "amb_crowd", "amb_occlusion", "amb_invisible")
#: Fig. 3's parts: the answer their questions have.
FIG3_PARTS = {"fig3a": "no", "fig3b": "yes"}
#: Fig. 6's parts: the rules each compares with the unambiguous images, a row each.
FIG6_PARTS = {"fig6a": ("ambiguous",), "fig6b": AMBIGUITY_RULES[:2], "fig6c": AMBIGUITY_RULES[2:]}
RULE_TITLES = {"ambiguous": "any rule (paper's Amb.)", "amb_size": "size ratio", "amb_crowd": "crowd",
               "amb_occlusion": "occlusion", "amb_invisible": "invisible HOI"}
TOP = 105
PAPER_MARK = {"marker": "D", "color": "black", "linestyle": "none", "markersize": 5, "zorder": 5}


@dataclass(frozen=True)
class Drawn:
    """Which run of a model a figure draws, and how its legend names it."""

    variant: str = "default"
    decoding: str | None = None  # the bars' decoding (:func:`variant_decoding`); None: not known, nothing said
    paper: str = PAPER_VARIANT  # the paper's decoding its mark shows: the variant's paper_name, else beam5

    @property
    def label(self) -> str:
        """The variant, and its decoding where that names it otherwise ("default (greedy)")."""
        return self.variant + (f" ({self.decoding})" if self.decoding and self.decoding != self.variant else "")


def drawn_runs(variants: Mapping[str, str], variant_entries: Mapping[str, Mapping]) -> dict[str, Drawn]:
    """model -> :class:`Drawn` of the variant ``variants`` gives it (``variant_entries``: config ``variants``)."""
    def drawn(variant: str) -> Drawn:
        entry = Variant.from_config(dict(variant_entries.get(variant) or {}))
        return Drawn(variant, variant_decoding(variant_entries.get(variant)), entry.paper_name or PAPER_VARIANT)

    return {model: drawn(variant) for model, variant in variants.items()}


@dataclass(frozen=True)
class Bar:
    """One quantity of a panel: where it is in our metrics table and, if anywhere, in the paper's."""

    label: str
    qset: str
    metric: str
    subset: str = "all"
    condition: str = "clean"
    dataset: str = "hico"
    paper: tuple[str, str, str] | None = None  # (qset, condition, metric) in paper_tables.csv
    colour: str | None = None  # default: the next colour of the cycle
    hatched: bool = False  # the comparison bar of a pair (same colour, hatched)


def _metric_lookup(metrics: pd.DataFrame, drawn: Mapping[str, Drawn]) -> pd.DataFrame:
    """The metric rows of each model's drawn variant (``default`` for a model ``drawn`` does not name)."""
    chosen = metrics[metrics.variant == metrics.model.map(lambda m: _drawn(drawn, m).variant)]
    table = chosen.set_index(["dataset", "model", "qset", "condition", "subset", "metric"])
    return table[~table.index.duplicated()][["value", "ci_low", "ci_high", "n"]]


def _models(metrics: pd.DataFrame, models: Sequence[str] | None) -> list[str]:
    return list(models) if models is not None else list(dict.fromkeys(metrics.model))


def _drawn(drawn: Mapping[str, Drawn], model: str) -> Drawn:
    return drawn.get(model, Drawn())


def _tick(model: str, paper_names: Mapping[str, str]) -> str:
    name = paper_names.get(model)
    return f"{model}\n({name})" if name else model


def _uniform(drawn: Mapping[str, Drawn], models: Sequence[str]) -> Drawn | None:
    """The one :class:`Drawn` of every model, or None where models draw different variants."""
    found = {_drawn(drawn, m) for m in models}
    return found.pop() if len(found) == 1 else None


def _most(drawn: Mapping[str, Drawn], models: Sequence[str]) -> tuple[Drawn, dict[str, list[str]]]:
    """The :class:`Drawn` most models share (the first model's among equals), and the others' labels -> their
    models: the legend and the note name the first once, then each other with its models."""
    found = [_drawn(drawn, m) for m in models] or [Drawn()]
    most = max(dict.fromkeys(found), key=found.count)
    others: dict[str, list[str]] = {}
    for model, own in zip(models, found):
        if own != most:
            others.setdefault(own.label, []).append(model)
    return most, others


def _bars_text(drawn: Mapping[str, Drawn], models: Sequence[str]) -> str:
    """Which variant the bars are: "beam5", or "beam5; default (greedy): molmo_7b_d, prior" where models differ."""
    most, others = _most(drawn, models)
    return most.label + "".join(f"; {label}: {', '.join(named)}" for label, named in others.items())


def variant_decoding(entry: Mapping | None) -> str:
    """How the legend names a variant's decoding: the paper's name for it where the variant declares one
    (``paper_name``: ``beam5``, ``VCD``, ``OPERA``), else its own (``greedy``, ``beam5``, ``sample``, ``+vcd``)."""
    variant = Variant.from_config(dict(entry or {}))
    return variant.paper_name or variant.label


def mark_label(drawn: Mapping[str, Drawn], marked: Sequence[str]) -> str:
    """The paper mark's legend entry: the paper's decoding of the ``marked`` models' marks, and whose bars do not
    share it (a decoding None: not known, nothing said)."""
    papers = "/".join(sorted({_drawn(drawn, m).paper for m in marked}))
    unlike = {m: _drawn(drawn, m) for m in marked if _drawn(drawn, m).decoding is not None
              and _drawn(drawn, m).decoding != _drawn(drawn, m).paper}
    if any(_drawn(drawn, m).decoding is None for m in marked) and not unlike:
        return f"paper ({papers})"
    if not unlike:
        return f"paper ({papers}, as the bars)"
    if set(unlike) == set(marked) and len({d.decoding for d in unlike.values()}) == 1:
        return f"paper ({papers}); bars: {next(iter(unlike.values())).decoding}, not like for like"
    named = ", ".join(f"{m} {d.decoding}" for m, d in unlike.items())
    return f"paper ({papers}); bars of {named}: not like for like"


def bars_title(drawn: Mapping[str, Drawn], models: Sequence[str], width: float) -> str:
    """The legend's title: which of our variants the bars are, with its decoding (where models differ: the one
    most draw, then each other with its models), wrapped to ``width`` inches."""
    return wrap(f"ours: {_bars_text(drawn, models)}", width)


def bar_panel(axis, lookup: pd.DataFrame, models: Sequence[str], bars: Sequence[Bar], paper: pd.DataFrame,
              paper_names: Mapping[str, str], title: str, ylabel: str, *, drawn: Mapping[str, Drawn] | None = None,
              legend: bool = True, tick_labels: bool = True, marks: Mapping[str, str] | None = None) -> None:
    """Grouped bars (x100) with bootstrap error bars and paper marks on one axis.

    Each bar patch has gid ``"<model>|<bar label>"``, each paper mark ``"paper|<model>|<bar label>"``,
    so a reader (or a test) can find a value without knowing the layout. A model without a value for a series
    (not asked that set, not run, or undefined) gets a grey "n/a" in its bar's place, never an empty slot that
    reads as 0. Where a bar stands on fewer than
    :data:`~verbmirage.analysis.figure_layout.SMALL_N` questions its n is printed: once in the title for a
    series whose bars all have the same n (every model asked the same questions), else on the bar. The legend
    (below the axis; ``legend`` off: none) lists every series of ``bars`` under the title :func:`bars_title`
    and, where a mark is drawn, the paper's decoding (:func:`mark_label`). ``drawn``: each model's variant
    (:class:`Drawn`; the lookup holds its rows); where models draw different ones, the legend's title names
    the one most draw, then each other with its models. ``tick_labels`` off: no model names under the panel
    (a grid names them under its bottom row); ``marks``: model -> a word added under its name.
    """
    drawn = drawn or {}
    width = 0.8 / max(1, len(bars))
    colours = [bar.colour or f"C{i}" for i, bar in enumerate(bars)]
    any_bar, marked, small, absent, valued = False, [], [], [], set()
    for j, bar in enumerate(bars):  # one bar call per series (a call per bar cost most of a figure's time)
        xs, values, errors, gids, counts = [], [], [], [], []
        for i, model in enumerate(models):
            key = (bar.dataset, model, bar.qset, bar.condition, bar.subset, bar.metric)
            value = 100 * lookup.loc[key, "value"] if key in lookup.index else math.nan
            if not math.isfinite(value):  # not asked, not run, or undefined: said, so it never reads as 0
                absent.append(i - 0.4 + width * (j + 0.5))
                continue
            low, high = (100 * lookup.loc[key, c] for c in ("ci_low", "ci_high"))
            xs.append(i - 0.4 + width * (j + 0.5))
            values.append(value)
            interval = math.isfinite(low) and math.isfinite(high)
            errors.append((value - low, high - value) if interval else (math.nan, math.nan))
            gids.append(f"{model}|{bar.label}")
            counts.append(lookup.loc[key, "n"])
            valued.add(model)
        if xs:
            spans = np.array(errors).T
            drawn_bars = axis.bar(xs, values, width, yerr=None if np.isnan(spans).all() else spans, capsize=2,
                                  color=colours[j], **_bar_style(bar))
            for patch, gid in zip(drawn_bars.patches, gids):
                patch.set_gid(gid)
            if len(set(counts)) == 1 and n_label(counts[0]):  # one n for the series: said once, in the title
                small.append(f"{bar.label} {n_label(counts[0])}")
            elif len(set(counts)) > 1:  # else on each small bar, inside it from its base
                for x, n in zip(xs, counts):
                    if n_label(n):
                        axis.text(x, 1, n_label(n), rotation=90, ha="center", va="bottom", fontsize=FONT, zorder=6)
            any_bar = True
        if bar.paper:
            for i, model in enumerate(models):
                published = paper_value(paper, paper_names.get(model), *bar.paper, variant=_drawn(drawn, model).paper)
                if math.isfinite(published):
                    axis.plot([i - 0.4 + width * (j + 0.5)], [published], gid=f"paper|{model}|{bar.label}",
                              **PAPER_MARK)
                    marked.append(model)
    marks = marks or {}
    ticks = [_tick(m, paper_names) + (f"\n({marks[m]})" if m in marks else "") for m in models] if tick_labels \
        else [""] * len(models)
    rotation = tick_rotation(ticks, axis)
    axis.set_xticks(range(len(models)), ticks, rotation=rotation, ha="right" if rotation else "center",
                    rotation_mode="anchor")
    axis.set_xlim(-0.6, len(models) - 0.4)
    fit_title(axis, title + (f" (small samples: {', '.join(small)})" if small else ""))
    axis.set_ylabel(ylabel)
    if not any_bar and not marked:
        axis.text(0.5, 0.5, "no questions in this panel", ha="center", va="center", transform=axis.transAxes)
    else:
        for x in absent:
            axis.text(x, 1, "n/a", rotation=90, ha="center", va="bottom", fontsize=FONT, color="grey", zorder=6,
                      gid="n/a")
    if legend:
        handles = [Patch(facecolor=colour, label=bar.label, **_bar_style(bar)) for bar, colour in zip(bars, colours)]
        if marked:
            handles.append(Line2D([], [], label=mark_label(drawn, list(dict.fromkeys(marked))), **PAPER_MARK))
        named = [model for model in models if model in valued] or list(models)  # not those drawn as n/a
        legend_below(axis, handles, rotation, title=bars_title(drawn, named, axis_width(axis)))  # clear of bars
    axis.axhline(0, color="grey", linewidth=0.5)


def _bar_style(bar: Bar) -> dict:
    """The comparison bar of a pair: the same colour, hatched and lighter."""
    return {"hatch": "///", "alpha": 0.55, "edgecolor": "white"} if bar.hatched else {}


def _figure(n_panels: int, title: str, note: str, models: Sequence[str], columns: int = 2,
            panel_height: float = 3.4) -> tuple:
    """A page-wide figure with ``n_panels`` bar panels, as many a row (at most ``columns``) as leave each model's
    group of bars room (:func:`~verbmirage.analysis.figure_layout.columns_for`); the note under the title."""
    columns = min(columns, columns_for(n_panels, len(models)))
    return page_figure(n_panels, columns=columns, panel_height=panel_height, heading="\n".join([title, note]).strip())


def _finish(figure: Figure) -> Figure:
    return figure  # constrained layout: the figure places its panels, legends and heading when drawn


def _accuracy_figure(heading: str, title: str, bars: Sequence[Bar], metrics: pd.DataFrame, paper: pd.DataFrame,
                     models: Sequence[str], paper_names: Mapping[str, str] | None,
                     drawn: Mapping[str, Drawn] | None, note: str) -> Figure:
    """A figure of one panel of accuracy bars (Figs. 1 and 3), 0 to 100 %."""
    with page_style():
        figure, axes = _figure(1, heading, note, models)
        bar_panel(axes[0], _metric_lookup(metrics, drawn or {}), models, bars, paper, paper_names or {}, title,
                  "accuracy (%)", drawn=drawn)
        axes[0].set_ylim(0, TOP)
    return _finish(figure)


def fig1_object_vs_verb(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                        models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                        condition: str = "clean", drawn: Mapping[str, Drawn] | None = None,
                        note: str = "") -> Figure:
    """Fig. 1: YN accuracy with and without the object named, next to object existence (not POPE)."""
    paper = empty_paper_numbers() if paper is None else paper
    bars = [
        Bar("YN w/ object (yn_obj)", "yn_obj", "accuracy", condition=condition,
            paper=("yn_obj", condition, "accuracy")),
        Bar("YN verb only (yn_verb)", "yn_verb", "accuracy", condition=condition,
            paper=("yn_verb", condition, "accuracy")),
        Bar("object existence (obj_exist, not POPE)", "obj_exist", "accuracy", condition=condition),
    ]
    return _accuracy_figure(f"{FIGURES['fig1']} ({condition})", "accuracy per model", bars, metrics, paper,
                            _models(metrics, models), paper_names, drawn, note)


def fig3_rare_common(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                     models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                     condition: str = "clean", drawn: Mapping[str, Drawn] | None = None,
                     note: str = "", part: str = "fig3a") -> Figure:
    """Fig. 3, one part (:data:`FIG3_PARTS`): accuracy on answer-No (``fig3a``, the paper's figure) or
    answer-Yes questions (``fig3b``), rare vs non-rare HOIs and common vs non-common verbs."""
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    answer = FIG3_PARTS[part]
    bars = [
        Bar("yn_obj rare HOI", "yn_obj", "accuracy", f"rare_{answer}", condition, colour="C0"),
        Bar("yn_obj non-rare HOI", "yn_obj", "accuracy", f"non_rare_{answer}", condition, colour="C0", hatched=True),
        Bar("yn_verb common verb", "yn_verb", "accuracy", f"common_{answer}", condition, colour="C1"),
        Bar("yn_verb non-common verb", "yn_verb", "accuracy", f"non_common_{answer}", condition, colour="C1",
            hatched=True),
    ]
    title = "correct answer No" if answer == "no" else "correct answer Yes (accuracy = recall)"
    return _accuracy_figure(f"{FIGURES[part]} ({condition})", f"accuracy per model, {title}", bars, metrics, paper,
                            models, paper_names, drawn, note)


def fig4b_error_consistency(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                            models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                            pair: tuple[str, str] = ("clean", "saltpepper"),
                            drawn: Mapping[str, Drawn] | None = None, note: str = "",
                            image_free: Sequence[str] = ()) -> Figure:
    """Fig. 4(b): error consistency kappa (x100) between two image conditions, objects vs verbs.

    ``image_free``: models that never look at the image; their kappa is 100 by construction, which the figure
    says under its title and beside their names."""
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    blind = [model for model in models if model in set(image_free)]
    if blind:
        note = "\n".join(filter(None, [note, f"never see the image, so kappa is 100 by construction: "
                                               f"{', '.join(blind)} (marked 'blind')"]))
    reference, other = pair
    ours, theirs = f"{reference}_vs_{other}", f"{reference}~{other}"
    bars = [
        Bar("object existence (obj_exist)", "obj_exist", "error_consistency", condition=ours),
        Bar("YN w/ object (yn_obj)", "yn_obj", "error_consistency", condition=ours),
        Bar("YN verb only (yn_verb)", "yn_verb", "error_consistency", condition=ours,
            paper=("yn_verb", theirs, "error_consistency_kappa_x100")),
    ]
    with page_style():
        figure, axes = _figure(1, f"{FIGURES['fig4b']} ({reference} vs {other})", note, models)
        axis = axes[0]
        bar_panel(axis, _metric_lookup(metrics, drawn or {}), models, bars, paper, paper_names or {},
                  "Cohen's kappa of correctness (error consistency)", "kappa x100", drawn=drawn,
                  marks={model: "blind" for model in blind})
        low = min([0.0, *[patch.get_y() + min(0.0, patch.get_height()) for patch in axis.patches]])
        axis.set_ylim(min(-5.0, low - 5), TOP)
    return _finish(figure)


def fig5_ego_exo(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                 models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                 condition: str = "clean", drawn: Mapping[str, Drawn] | None = None,
                 note: str = "") -> Figure:
    """Fig. 5: CharadesEgo MC circular accuracy and YN accuracy, egocentric vs exocentric (Table 4's data)."""
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    lookup = _metric_lookup(metrics, drawn or {})
    mc = [Bar(f"{view}centric", f"mc_{view}", "circular_accuracy", condition=condition, dataset="charadesego")
          for view in ("ego", "exo")]
    yn = [Bar(f"{view}centric", f"yn_{view}", "accuracy", condition=condition, dataset="charadesego",
              paper=("charadesego_yn", view, "accuracy")) for view in ("ego", "exo")]
    with page_style():
        figure, axes = _figure(2, FIGURES["fig5"], note, models)
        bar_panel(axes[0], lookup, models, mc, paper, paper_names or {},
                  "(a) MC, circular accuracy (the paper's figure)", "circular accuracy (%)",
                  drawn=drawn)
        bar_panel(axes[1], lookup, models, yn, paper, paper_names or {}, "(b) YN accuracy (the paper's Table 4)",
                  "accuracy (%)", drawn=drawn)
        for axis in axes:
            axis.set_ylim(0, TOP)
    return _finish(figure)


def fig6_ambiguity(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                   models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                   condition: str = "clean", drawn: Mapping[str, Drawn] | None = None,
                   note: str = "", part: str = "fig6a") -> Figure:
    """Fig. 6, one part (:data:`FIG6_PARTS`): accuracy on ambiguous vs unambiguous images, a row per rule
    (``fig6a``: any rule, the paper's split; ``fig6b``, ``fig6c``: two rules each).

    Left: YN accuracy (``yn_obj``, ``yn_verb``); right: MC circular accuracy (``mc_obj``, ``mc_verb``).
    Each row compares the images one rule flags with the unambiguous images (flagged by none). The series
    are the same in every row, so only the top row carries the legends.
    """
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    lookup = _metric_lookup(metrics, drawn or {})
    rules = FIG6_PARTS[part]
    kinds = (("YN accuracy", ("yn_obj", "yn_verb"), "accuracy"),
             ("MC circular accuracy", ("mc_obj", "mc_verb"), "circular_accuracy"))
    with page_style():
        figure, axes = page_figure(len(rules) * len(kinds), columns=len(kinds), panel_height=2.3,
                                   heading="\n".join([f"{FIGURES[part]} ({condition})", note]).strip())
        for row, rule in enumerate(rules):
            for column, (kind, qsets, metric) in enumerate(kinds):
                bars = [Bar(f"{qset} {'unamb.' if subset == 'unambiguous' else 'amb.'}", qset, metric, subset,
                            condition, colour=f"C{k}", hatched=subset == "unambiguous")
                        for k, qset in enumerate(qsets) for subset in (rule, "unambiguous")]
                axis = axes[row * len(kinds) + column]
                bar_panel(axis, lookup, models, bars, paper, paper_names or {},
                          f"{kind}: {RULE_TITLES[rule]} vs unambiguous", f"{kind.split()[-1]} (%)",
                          drawn=drawn, legend=row == 0,
                          tick_labels=row == len(rules) - 1)  # the model names once, under the bottom row
                axis.set_ylim(0, TOP)
    return _finish(figure)


DRAW = {
    "fig1": fig1_object_vs_verb,
    **{part: partial(fig3_rare_common, part=part) for part in FIG3_PARTS},
    "fig4b": fig4b_error_consistency,
    "fig5": fig5_ego_exo,
    **{part: partial(fig6_ambiguity, part=part) for part in FIG6_PARTS},
}


def figure_note(model_entries: Mapping[str, Mapping], paper_names: Mapping[str, str], drawn: Mapping[str, Drawn],
                models: Sequence[str] | None = None) -> str:
    """What a reader must know under every title: which decoding the bars and the marks are, which bars are noise.

    ``paper_names``: slug -> the paper's model (``models.<slug>.paper_name``); only those models get marks.
    ``drawn``: each model's variant (:class:`Drawn`); ``models``: the figure's (default: those of ``drawn``).
    Where a model's bars are not the decoding of its mark, the note says whose.
    """
    models = list(drawn) if models is None else list(models)
    uniform = _uniform(drawn, models)
    bars = f"bars: variant {_bars_text(drawn, models)}"
    marked = [m for m in models if m in paper_names]
    if marked:
        papers = "/".join(sorted({_drawn(drawn, m).paper for m in marked}))
        unlike = [m for m in marked if _drawn(drawn, m).decoding not in (None, _drawn(drawn, m).paper)]
        differs = "" if not unlike else f", not the bars' {_drawn(drawn, unlike[0]).decoding}" if uniform else \
            f", not the bars' decoding for {', '.join(unlike)}"
        lines = [f"{bars}; diamonds: the paper's number ({papers}{differs}) for the model named under a group"]
    else:
        lines = [f"{bars}; no paper marks: no model has a paper_name (models.<slug>.paper_name)"]
    tiny = [slug for slug, entry in model_entries.items() if "tiny_" in str(entry.get("path", ""))]
    if tiny:
        marked = [slug for slug in tiny if slug in paper_names]
        lines.append(f"{', '.join(tiny)}: tiny model(s) with RANDOM weights, their bars are noise"
                     + (f" ({', '.join(marked)}: the mark is the real model's number, for scale)" if marked else ""))
    return "\n".join(lines)


def bar_values(figure: Figure) -> dict[str, float]:
    """Every bar's height by its gid ``"<model>|<bar label>"`` (and paper marks by ``"paper|..."``)."""
    values = {}
    for axis in figure.axes:
        title = axis.get_title()
        for patch in axis.patches:
            if patch.get_gid():
                values[f"{title}|{patch.get_gid()}"] = float(patch.get_height())
        for line in axis.lines:
            if (line.get_gid() or "").startswith("paper|"):
                values[f"{title}|{line.get_gid()}"] = float(np.asarray(line.get_ydata())[0])
    return values


def draw_paper_figures(metrics: pd.DataFrame, paths: Mapping[str, str | Path], paper: pd.DataFrame | None = None,
                       *, pair: tuple[str, str] = ("clean", "saltpepper"),
                       drawn: Mapping[str, Mapping[str, Drawn]] | None = None,
                       model_entries: Mapping[str, Mapping] | None = None, models: Sequence[str] | None = None,
                       paper_names: Mapping[str, str] | None = None, image_free: Sequence[str] = ()) -> dict[str, str]:
    """Write each figure of ``paths`` (a name of :data:`DRAW`: ``fig1``, ``fig3a``, ... -> PNG), its PDF and SVG
    beside it (:func:`~verbmirage.analysis.figure_layout.save_figure`), with :func:`figure_note` under its title;
    return each figure's note (for the job's log).

    ``drawn``: figure -> model -> the variant its bars draw (:class:`Drawn`, :func:`drawn_runs`; a figure or model
    it leaves out: ``default``); ``model_entries``: config ``models`` (to note tiny random-weight models);
    ``models``: the bar groups, in order; ``paper_names``: slug -> the paper's model; ``image_free``: the models
    that never look at the image (Fig. 4(b) marks them).
    """
    unknown = sorted(set(paths) - set(DRAW))
    if unknown:
        raise ValueError(f"unknown paper figures {unknown}; known: {sorted(DRAW)}")
    notes = {}
    for name, path in paths.items():
        extra = {"pair": pair, "image_free": image_free} if name == "fig4b" else {}
        own = (drawn or {}).get(name, {})
        chosen = models if models is not None else list(dict.fromkeys(metrics.model))
        present = set(metrics.model[metrics.dataset.eq("charadesego" if name == "fig5" else "hico")])
        shown = [model for model in chosen if model in present]  # the note names no model the figure shows as n/a
        notes[name] = figure_note(model_entries or {}, paper_names or {}, own, shown)
        save_figure(DRAW[name](metrics, paper, note=notes[name], models=models, paper_names=paper_names, drawn=own,
                               **extra), path)
    return notes
