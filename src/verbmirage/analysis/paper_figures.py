"""The paper's Figs. 1, 3, 4(b), 5 and 6, drawn from the long metrics table only.

Every figure is grouped bars, one group per model, one bar per quantity, in percent (kappa x100),
with the metric's bootstrap interval over images as an error bar. Where the paper's numbers
(:mod:`verbmirage.paper_numbers`, the packaged ``paper_tables.csv``) have the quantity for the model a
group stands for (``models.<slug>.paper_name``), a black diamond marks it: the paper's decoding
(``paper_variant``: the drawn variant's ``paper_name``, else the paper's default ``beam5``), which the
legend names. A combination the run did not ask (e.g. a set not run under noise) has no bar.

- Fig. 1: YN accuracy with (``yn_obj``) and without (``yn_verb``) object reference next to an
  object-hallucination score. The paper quotes POPE from the literature; ours is the accuracy on
  ``obj_exist`` (same images, in-domain), labelled "not POPE".
- Fig. 3: answer-No questions, rare vs non-rare HOIs (``yn_obj``) and common vs non-common verbs
  (``yn_verb``); plus the answer-Yes side (the recall of those subsets).
- Fig. 4(b): error consistency (Cohen's kappa of correctness) clean vs noisy images for object
  existence vs verbs.
- Fig. 5: CharadesEgo, egocentric vs exocentric views: MC circular accuracy (the paper's figure)
  and YN accuracy (its Table 4).
- Fig. 6: ambiguous vs unambiguous images (HICO-DET tags), and one column per ambiguity rule.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from verbmirage.paper_numbers import PAPER_VARIANT, empty_paper_numbers, paper_value

FIGURES = {
    "fig1": "Fig. 1: object vs verb hallucination",
    "fig3": "Fig. 3: rare and common verbs",
    "fig4b": "Fig. 4(b): error consistency, objects vs verbs",
    "fig5": "Fig. 5: egocentric vs exocentric views (CharadesEgo)",
    "fig6": "Fig. 6: ambiguous vs unambiguous images",
}
AMBIGUITY_RULES = ("amb_size", "amb_crowd", "amb_occlusion", "amb_invisible")
RULE_TITLES = {"ambiguous": "any rule (paper's Amb.)", "amb_size": "size ratio", "amb_crowd": "crowd",
               "amb_occlusion": "occlusion", "amb_invisible": "invisible HOI"}
TOP = 105
PAPER_MARK = {"marker": "D", "color": "black", "linestyle": "none", "markersize": 5, "zorder": 5}


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


def _metric_lookup(metrics: pd.DataFrame, variant: str) -> pd.DataFrame:
    chosen = metrics[metrics.variant == variant]
    table = chosen.set_index(["dataset", "model", "qset", "condition", "subset", "metric"])
    return table[~table.index.duplicated()][["value", "ci_low", "ci_high", "n"]]


def _models(metrics: pd.DataFrame, models: Sequence[str] | None) -> list[str]:
    return list(models) if models is not None else list(dict.fromkeys(metrics.model))


def _tick(model: str, paper_names: Mapping[str, str]) -> str:
    name = paper_names.get(model)
    return f"{model}\n({name})" if name else model


def bar_panel(axis, lookup: pd.DataFrame, models: Sequence[str], bars: Sequence[Bar], paper: pd.DataFrame,
              paper_names: Mapping[str, str], title: str, ylabel: str, paper_variant: str = PAPER_VARIANT) -> None:
    """Grouped bars (x100) with bootstrap error bars and paper marks on one axis.

    Each bar patch has gid ``"<model>|<bar label>"``, each paper mark ``"paper|<model>|<bar label>"``,
    so a reader (or a test) can find a value without knowing the layout.
    """
    width = 0.8 / max(1, len(bars))
    colours = [bar.colour or f"C{i}" for i, bar in enumerate(bars)]
    drawn, marked = set(), False
    for j, bar in enumerate(bars):  # one bar call per series (a call per bar cost most of a figure's time)
        xs, values, errors, gids = [], [], [], []
        for i, model in enumerate(models):
            key = (bar.dataset, model, bar.qset, bar.condition, bar.subset, bar.metric)
            if key in lookup.index:
                value, low, high = (100 * lookup.loc[key, c] for c in ("value", "ci_low", "ci_high"))
                if math.isfinite(value):
                    xs.append(i - 0.4 + width * (j + 0.5))
                    values.append(value)
                    interval = math.isfinite(low) and math.isfinite(high)
                    errors.append((value - low, high - value) if interval else (math.nan, math.nan))
                    gids.append(f"{model}|{bar.label}")
        if xs:
            style = {"hatch": "///", "alpha": 0.55, "edgecolor": "white"} if bar.hatched else {}
            spans = np.array(errors).T
            drawn_bars = axis.bar(xs, values, width, yerr=None if np.isnan(spans).all() else spans, capsize=2,
                                  color=colours[j], label=bar.label if bar.label not in drawn else None, **style)
            for patch, gid in zip(drawn_bars.patches, gids):
                patch.set_gid(gid)
            drawn.add(bar.label)
        if bar.paper:
            for i, model in enumerate(models):
                published = paper_value(paper, paper_names.get(model), *bar.paper, variant=paper_variant)
                if math.isfinite(published):
                    axis.plot([i - 0.4 + width * (j + 0.5)], [published], gid=f"paper|{model}|{bar.label}",
                              label=None if marked else f"paper ({paper_variant})", **PAPER_MARK)
                    marked = True
    axis.set_xticks(range(len(models)), [_tick(m, paper_names) for m in models], fontsize=7)
    axis.set_xlim(-0.6, len(models) - 0.4)
    axis.set_title(title, fontsize=9)
    axis.set_ylabel(ylabel, fontsize=8)
    if drawn or marked:
        # below the axis, so no bar hides under it
        axis.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(3, len(bars) + marked),
                    frameon=False)
    else:
        axis.text(0.5, 0.5, "no questions in this panel", ha="center", va="center", transform=axis.transAxes)
    axis.axhline(0, color="grey", linewidth=0.5)


def _figure(rows: int, columns: int, title: str, note: str, width: float = 5.5, height: float = 3.6) -> tuple:
    # the note wraps to the figure's width (about 15 characters per inch at this size)
    lines = [wrapped for line in note.splitlines() for wrapped in textwrap.wrap(line, int(15 * width * columns))]
    figure = Figure(figsize=(width * columns, height * rows + 0.5 + 0.18 * len(lines)))
    axes = figure.subplots(rows, columns, squeeze=False)
    figure.suptitle("\n".join([title, *lines]), fontsize=9)
    return figure, axes


def _finish(figure: Figure) -> Figure:
    figure.tight_layout()
    return figure


def fig1_object_vs_verb(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                        models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                        condition: str = "clean", variant: str = "default", paper_variant: str = PAPER_VARIANT,
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
    models = _models(metrics, models)
    figure, axes = _figure(1, 1, f"{FIGURES['fig1']} ({condition})", note, width=max(6, 1.6 * len(models)))
    bar_panel(axes[0, 0], _metric_lookup(metrics, variant), models, bars, paper,
              paper_names or {}, "accuracy per model", "accuracy (%)", paper_variant=paper_variant)
    axes[0, 0].set_ylim(0, TOP)
    return _finish(figure)


def fig3_rare_common(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                     models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                     condition: str = "clean", variant: str = "default", paper_variant: str = PAPER_VARIANT,
                note: str = "") -> Figure:
    """Fig. 3: accuracy on answer-No (and answer-Yes) questions, rare vs non-rare and common vs non-common."""
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    lookup = _metric_lookup(metrics, variant)
    figure, axes = _figure(1, 2, f"{FIGURES['fig3']} ({condition})", note, width=max(5.5, 1.5 * len(models)))
    for axis, answer, title in ((axes[0, 0], "no", "(a) correct answer No (the paper's figure)"),
                                (axes[0, 1], "yes", "(b) correct answer Yes (recall)")):
        bars = [
            Bar("yn_obj rare HOI", "yn_obj", "accuracy", f"rare_{answer}", condition, colour="C0"),
            Bar("yn_obj non-rare HOI", "yn_obj", "accuracy", f"non_rare_{answer}", condition, colour="C0",
                hatched=True),
            Bar("yn_verb common verb", "yn_verb", "accuracy", f"common_{answer}", condition, colour="C1"),
            Bar("yn_verb non-common verb", "yn_verb", "accuracy", f"non_common_{answer}", condition, colour="C1",
                hatched=True),
        ]
        bar_panel(axis, lookup, models, bars, paper, paper_names or {}, title, "accuracy (%)",
                  paper_variant=paper_variant)
        axis.set_ylim(0, TOP)
    return _finish(figure)


def fig4b_error_consistency(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                            models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                            pair: tuple[str, str] = ("clean", "saltpepper"), variant: str = "default",
                            paper_variant: str = PAPER_VARIANT, note: str = "") -> Figure:
    """Fig. 4(b): error consistency kappa (x100) between two image conditions, objects vs verbs."""
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    reference, other = pair
    ours, theirs = f"{reference}_vs_{other}", f"{reference}~{other}"
    bars = [
        Bar("object existence (obj_exist)", "obj_exist", "error_consistency", condition=ours),
        Bar("YN w/ object (yn_obj)", "yn_obj", "error_consistency", condition=ours),
        Bar("YN verb only (yn_verb)", "yn_verb", "error_consistency", condition=ours,
            paper=("yn_verb", theirs, "error_consistency_kappa_x100")),
    ]
    figure, axes = _figure(1, 1, f"{FIGURES['fig4b']} ({reference} vs {other})", note,
                           width=max(6, 1.6 * len(models)))
    axis = axes[0, 0]
    bar_panel(axis, _metric_lookup(metrics, variant), models, bars, paper, paper_names or {},
              "Cohen's kappa of correctness (error consistency)", "kappa x100", paper_variant=paper_variant)
    low = min([0.0, *[patch.get_y() + min(0.0, patch.get_height()) for patch in axis.patches]])
    axis.set_ylim(min(-5.0, low - 5), TOP)
    return _finish(figure)


def fig5_ego_exo(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                 models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                 condition: str = "clean", variant: str = "default", paper_variant: str = PAPER_VARIANT,
                note: str = "") -> Figure:
    """Fig. 5: CharadesEgo MC circular accuracy and YN accuracy, egocentric vs exocentric (Table 4's data)."""
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    lookup = _metric_lookup(metrics, variant)
    figure, axes = _figure(1, 2, FIGURES["fig5"], note, width=max(5.5, 1.5 * len(models)))
    mc = [Bar(f"{view}centric", f"mc_{view}", "circular_accuracy", condition=condition, dataset="charadesego")
          for view in ("ego", "exo")]
    yn = [Bar(f"{view}centric", f"yn_{view}", "accuracy", condition=condition, dataset="charadesego",
              paper=("charadesego_yn", view, "accuracy")) for view in ("ego", "exo")]
    bar_panel(axes[0, 0], lookup, models, mc, paper, paper_names or {},
              "(a) MC, circular accuracy (the paper's figure)",
              "circular accuracy (%)", paper_variant=paper_variant)
    bar_panel(axes[0, 1], lookup, models, yn, paper, paper_names or {}, "(b) YN accuracy (the paper's Table 4)",
              "accuracy (%)", paper_variant=paper_variant)
    for axis in axes.flat:
        axis.set_ylim(0, TOP)
    return _finish(figure)


def fig6_ambiguity(metrics: pd.DataFrame, paper: pd.DataFrame | None = None, *,
                   models: Sequence[str] | None = None, paper_names: Mapping[str, str] | None = None,
                   condition: str = "clean", variant: str = "default", paper_variant: str = PAPER_VARIANT,
                note: str = "") -> Figure:
    """Fig. 6: accuracy on ambiguous vs unambiguous images; one column per rule (the first: any rule).

    Row 1: YN accuracy (``yn_obj``, ``yn_verb``); row 2: MC circular accuracy (``mc_obj``, ``mc_verb``).
    Each column compares the images one rule flags with the unambiguous images (flagged by none).
    """
    paper = empty_paper_numbers() if paper is None else paper
    models = _models(metrics, models)
    lookup = _metric_lookup(metrics, variant)
    rules = ("ambiguous", *AMBIGUITY_RULES)
    figure, axes = _figure(2, len(rules), f"{FIGURES['fig6']} ({condition})", note,
                           width=max(4.5, 1.1 * len(models)), height=3.4)
    for row, (kind, qsets, metric) in enumerate((("YN accuracy", ("yn_obj", "yn_verb"), "accuracy"),
                                                 ("MC circular accuracy", ("mc_obj", "mc_verb"), "circular_accuracy"))):
        for column, rule in enumerate(rules):
            bars = [Bar(f"{qset} {'unamb.' if subset == 'unambiguous' else 'amb.'}", qset, metric, subset, condition,
                        colour=f"C{k}", hatched=subset == "unambiguous")
                    for k, qset in enumerate(qsets) for subset in (rule, "unambiguous")]
            bar_panel(axes[row, column], lookup, models, bars, paper, paper_names or {},
                      f"{kind}: {RULE_TITLES[rule]} vs unambiguous", f"{kind.split()[-1]} (%)",
                      paper_variant=paper_variant)
            axes[row, column].set_ylim(0, TOP)
    return _finish(figure)


DRAW = {
    "fig1": fig1_object_vs_verb,
    "fig3": fig3_rare_common,
    "fig4b": fig4b_error_consistency,
    "fig5": fig5_ego_exo,
    "fig6": fig6_ambiguity,
}


def figure_note(model_entries: Mapping[str, Mapping], paper_names: Mapping[str, str], variant: str,
                paper_variant: str) -> str:
    """What a reader must know under every title: which decoding the bars and the marks are, which bars are noise.

    ``paper_names``: slug -> the paper's model (``models.<slug>.paper_name``); only those models get marks.
    """
    if paper_names:
        lines = [f"bars: variant {variant}; diamonds: the paper's number ({paper_variant}) for the model named "
                 "under a group"]
    else:
        lines = [f"bars: variant {variant}; no paper marks: no model has a paper_name (models.<slug>.paper_name)"]
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
                       *, note: str = "", pair: tuple[str, str] = ("clean", "saltpepper"), **options) -> None:
    """Write each figure of ``paths`` (``fig1``, ``fig3``, ``fig4b``, ``fig5``, ``fig6`` -> PNG).

    ``options`` go to every figure function (``models``, ``paper_names``, ``variant``, ``paper_variant``).
    """
    unknown = sorted(set(paths) - set(DRAW))
    if unknown:
        raise ValueError(f"unknown paper figures {unknown}; known: {sorted(DRAW)}")
    for name, path in paths.items():
        extra = {"pair": pair} if name == "fig4b" else {}
        figure = DRAW[name](metrics, paper, note=note, **options, **extra)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=110)
