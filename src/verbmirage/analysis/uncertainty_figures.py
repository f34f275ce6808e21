"""The paper's uncertainty figures, drawn from Parquet tables only (never from a model).

- Figs. 9 (LLaVA role) and 12 (InstructBLIP role): density histograms of the answer token's
  probability u, correct vs hallucinated, in panels YN *predicted* yes, YN predicted no and MC
  (``uncertainty_hist.parquet``; the MC panel adds the MC sets' bin counts). With ``pool_yn`` off,
  each YN set gets its own pair of panels.
- Fig. 10 (field of view): per model and MC set, boxes of u for correct and hallucinated rows under
  each FOV condition, ordered by mean crop area (full image first), with plain and circular accuracy
  written above (``fov.parquet`` and ``fov_rows.parquet``). A row per model (its sets side by side), as
  many models a page as fit a page's height (:func:`fov_pages`): ``fig10a_fov.png``, ``fig10b_fov.png``, ...

Only logit-scored models have a u; the others are named as skipped under the title. Each model's rows are one
of its variants (``variants``: model -> variant, the run plan's choice, by default the paper's decoding: beam 5),
named with its decoding in the heading (Figs. 9, 12) or the panel's title (Fig. 10). Every figure is laid
out for a page and saved as PNG, PDF and SVG by :mod:`verbmirage.analysis.figure_layout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.analysis.attention_settings import figure_models
from verbmirage.analysis.figure_layout import (
    fit_title,
    legend_below,
    page_figure,
    page_style,
    save_figure,
    tick_rotation,
)
from verbmirage.analysis.fov_settings import FOV_PANEL_HEIGHT, fov_columns, fov_pages
from verbmirage.analysis.paper_figures import Drawn, drawn_runs
from verbmirage.benchmark.question_sets import question_kind

COLOURS = {True: "tab:blue", False: "tab:red"}
LABELS = {True: "correct", False: "hallucinated"}
PAPER_ROLES = {9: "llava", 12: "instructblip"}
TITLES = {9: "Fig. 9: token uncertainty", 12: "Fig. 12: token uncertainty"}


def uncertainty_roles(models: list[str], backends: dict[str, str],
                      chosen: Mapping[int, str] | None = None) -> dict[int, str | None]:
    """Fig. 9: the first llava model (else the first model); Fig. 12: the first instructblip model, else the
    next model, else the Fig. 9 one (the same rule as the attention figures); ``chosen`` (config
    ``analysis.uncertainty.figures``) first, and a figure it leaves to its role shows another model than the
    chosen one where there is another."""
    roles = figure_models(models, backends)
    chosen = dict(chosen or {})
    picked = {9: roles[7], 12: roles[14], **chosen}
    for number, other in ((9, 12), (12, 9)):
        if number not in chosen and picked[number] == picked[other]:
            picked[number] = next((m for m in models if m != picked[other]), picked[number])
    return picked


def _hist_panels(rows: pd.DataFrame) -> list[tuple[pd.DataFrame, str]]:
    """(bin rows, title) per panel: each YN label's pred_yes and pred_no (and pred_other when there are such
    answers), then MC (its sets' counts added)."""
    panels = []
    labels = list(dict.fromkeys(rows.qset))
    yn = [q for q in labels if question_kind(q.split("+")[0]) == "yn"]
    for label in yn or ["YN"]:
        for group, said in (("pred_yes", "yes"), ("pred_no", "no"), ("pred_other", "neither yes nor no")):
            part = rows[(rows.qset == label) & (rows.group == group)]
            if group != "pred_other" or len(part):
                panels.append((part, f"{label}, answered {said}"))
    mc = rows[rows.group == "mc"]
    mc_sets = "+".join(dict.fromkeys(mc.qset)) or "MC"
    panels.append((mc.groupby(["correct", "bin_left", "bin_right"], as_index=False)["count"].sum(), f"MC ({mc_sets})"))
    return panels


def _hist_panel(axis, bins: pd.DataFrame, title: str) -> None:
    """Density bars (count / (n x width)) of one panel, correct vs hallucinated."""
    for correct in (True, False):
        part = bins[bins.correct == correct].sort_values("bin_left")
        n = int(part["count"].sum())
        if not n:
            continue
        width = (part.bin_right - part.bin_left).to_numpy()
        density = part["count"].to_numpy() / (n * width)
        axis.stairs(density, np.append(part.bin_left.to_numpy(), part.bin_right.iloc[-1]), fill=True, alpha=0.5,
                    color=COLOURS[correct], label=f"{LABELS[correct]} (n={n})")
    axis.set_xlim(0, 1)
    axis.set_xlabel("u = P(answer token)")
    axis.set_ylabel("density")
    fit_title(axis, title)
    if bins.empty or not bins["count"].sum():
        axis.text(0.5, 0.5, "no rows", ha="center", va="center", transform=axis.transAxes)
    else:
        legend_below(axis, axis.get_legend_handles_labels()[0])  # under the panel: n stays readable


def _note_lines(model: str | None, number: int, backends: dict, notes: dict, skipped: list[str]) -> str:
    lines = []
    if model and backends.get(model) != PAPER_ROLES[number]:
        lines.append(f"drawn in place of the paper's {PAPER_ROLES[number]} model")
    if model and notes.get(model):
        lines.append(notes[model])
    if skipped:
        lines.append(f"skipped, no token probability: {', '.join(skipped)}")
    return "\n".join(lines)


def _drawn(variants: Mapping[str, str] | None, variant_entries: Mapping[str, Mapping] | None,
           model: str | None) -> Drawn:
    """The variant drawn of ``model`` (``default`` where ``variants`` names none) and how it is named."""
    return drawn_runs(variants or {}, variant_entries or {}).get(model, Drawn())


def draw_uncertainty_figures(hist: pd.DataFrame, paths: dict[int, str | Path], models: list[str],
                             backends: dict[str, str], notes: dict[str, str] | None = None,
                             skipped: list[str] | None = None, variants: Mapping[str, str] | None = None,
                             condition: str = "clean", variant_entries: Mapping[str, Mapping] | None = None,
                             chosen: Mapping[int, str] | None = None) -> dict[int, str | None]:
    """Write Figs. 9 and 12 (``paths``: number -> PNG, its PDF and SVG beside it) from the histogram table;
    return the roles used.

    ``models``: the models with a token probability, in config order; ``skipped``: those without, named
    under the title; ``variants``: model -> the variant drawn (``variant_entries``, config ``variants``, name its
    decoding in the heading); ``chosen``: figure number -> the model it shows instead of its role's.
    """
    notes, skipped = notes or {}, list(skipped or [])
    roles = uncertainty_roles(list(models), backends, chosen)
    for number, path in paths.items():
        model = roles.get(number)
        drawn = _drawn(variants, variant_entries, model)
        rows = hist[(hist.model == model) & (hist.variant == drawn.variant) & (hist.condition == condition)]
        panels = _hist_panels(rows)
        heading = f"{TITLES[number]} - {model or 'no logit-scored model'}, {drawn.label}, {condition}"
        note = _note_lines(model, number, backends, notes, skipped)
        with page_style():
            figure, axes = page_figure(len(panels), panel_height=2.9, heading=heading + (f"\n{note}" if note else ""))
            for axis, (bins, title) in zip(axes, panels):
                _hist_panel(axis, bins, title)
            save_figure(figure, path)
    return roles


def draw_fov_figure(fov: pd.DataFrame, rows: pd.DataFrame, paths: Sequence[str | Path], models: list[str],
                    qsets: Sequence[str], notes: dict[str, str] | None = None, skipped: list[str] | None = None,
                    variants: Mapping[str, str] | None = None,
                    variant_entries: Mapping[str, Mapping] | None = None) -> None:
    """Write Fig. 10, one page per path of ``paths`` (PNG, its PDF and SVG beside it; :func:`fov_pages`): per
    model and question set of ``qsets``, u by condition, correct vs hallucinated; a model's sets side by side.

    ``models``: the models with a token probability that the FOV analysis ran, in config order (a model
    without rows says so in its panels); ``skipped``: those without a token probability; ``variants``: model ->
    the variant drawn, named in its panels' titles (``variant_entries``: config ``variants``).
    """
    pages = fov_pages(models, len(qsets))
    if len(paths) != len(pages):
        raise ValueError(f"Fig. 10 of {len(models)} models and {len(qsets)} question sets takes {len(pages)} "
                         f"pages, {len(paths)} files given ({', '.join(map(str, paths))})")
    for number, (path, page) in enumerate(zip(paths, pages), 1):
        _draw_fov_page(fov, rows, path, page, list(qsets), notes or {}, list(skipped or []), variants,
                       variant_entries, f" (page {number} of {len(pages)})" if len(pages) > 1 else "")


def _draw_fov_page(fov: pd.DataFrame, rows: pd.DataFrame, path: str | Path, models: list[str], qsets: list[str],
                   notes: dict[str, str], skipped: list[str], variants: Mapping[str, str] | None,
                   variant_entries: Mapping[str, Mapping] | None, page: str) -> None:
    from matplotlib.patches import Patch

    cells = [(model, qset) for model in models or [None] for qset in qsets or ["(none)"]]
    heading = [f"Fig. 10{page}: field of view and token uncertainty (same questions in every condition; each "
               "panel names its model's variant)"]
    by_note = {}  # each note once, with the models it is about (not in every panel's title)
    for model in models:
        if notes.get(model):
            by_note.setdefault(notes[model], []).append(model)
    heading += [f"{', '.join(named)}: {note}" for note, named in by_note.items()]
    if skipped:
        heading.append(f"skipped, no token probability: {', '.join(skipped)}")
    with page_style():
        figure, axes = page_figure(len(cells), columns=fov_columns(len(qsets)), panel_height=FOV_PANEL_HEIGHT,
                                   heading="\n".join(heading))
        for axis, (model, qset) in zip(axes, cells):
            drawn = _drawn(variants, variant_entries, model)
            summary = fov[(fov.model == model) & (fov.variant == drawn.variant) & (fov.qset == qset)]
            summary = summary.sort_values("crop_area_frac_mean", ascending=False, kind="stable")
            if summary.empty:
                said = "no logit-scored model" if model is None else f"{model}, {qset}: no rows"
                axis.text(0.5, 0.5, said, ha="center", va="center", transform=axis.transAxes)
                axis.set_axis_off()
                continue
            part = rows[(rows.model == model) & (rows.variant == drawn.variant) & (rows.qset == qset)]
            for x, condition in enumerate(summary.itertuples(index=False)):
                here = part[part.condition == condition.condition]
                for correct, offset in ((True, -0.18), (False, 0.18)):
                    values = here.confidence[here.correct == correct].dropna().to_numpy(float)
                    if len(values):
                        box = axis.boxplot([values], positions=[x + offset], widths=0.3, patch_artist=True,
                                           showfliers=True, flierprops={"markersize": 2})
                        box["boxes"][0].set_facecolor(COLOURS[correct])
                        box["boxes"][0].set_alpha(0.5)
                circular = "" if np.isnan(condition.acc_circular) else f"\ncirc {100 * condition.acc_circular:.0f}%"
                axis.text(x, 1.02, f"plain {100 * condition.acc_plain:.0f}%{circular}", ha="center", va="bottom")
            ticks = [f"{c}\narea {100 * a:.0f}%" for c, a in zip(summary.condition, summary.crop_area_frac_mean)]
            rotation = tick_rotation(ticks, axis)
            axis.set_xticks(range(len(summary)), ticks, rotation=rotation, ha="right" if rotation else "center",
                            rotation_mode="anchor")
            axis.set_xlim(-0.6, len(summary) - 0.4)
            axis.set_ylim(0, 1.25)
            axis.set_ylabel("u = P(answer token)")
            fit_title(axis, f"{model} ({drawn.label}), {qset} (n={int(summary.n.iloc[0])} rows)")
            handles = [Patch(color=COLOURS[c], alpha=0.5, label=LABELS[c]) for c in (True, False)]
            axis.legend(handles=handles, loc="lower left")
        save_figure(figure, path)
