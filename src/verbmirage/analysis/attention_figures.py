"""The paper's attention figures (7, 8, 13, 14), drawn from ``results/analysis/attention.parquet`` only.

Every panel shows density histograms (20 bins on [0, 1]) of one share,
correct vs hallucinated (the attention run's own answer at q), at the last
analysed layer. As in the paper, YN panels split by the *ground-truth*
answer (unlike the uncertainty figures, which split by prediction).

- Fig. 7 (LLaVA role, ``yn_obj``): (a) key-area share, (b) verb share (Eq. 3).
- Fig. 8 (LLaVA role) and Fig. 14 (InstructBLIP role): visual-token share (Eq. 1/4),
  panels YN ground truth yes, YN ground truth no, MC.
- Fig. 13 (LLaVA role): the visual-token share per question set (our reading of
  the appendix figure: the Fig. 8 panels split by set; a proposal, not the paper's words).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.analysis.figure_layout import fit_title, legend_below, page_figure, page_style, save_figure

BINS = np.linspace(0.0, 1.0, 21)
FIGURES = {
    7: "key-area and verb attention (yn_obj)",
    8: "visual-token attention (YN by ground truth, MC)",
    13: "visual-token attention per question set",
    14: "visual-token attention (YN by ground truth, MC)",
}
YN_SETS = ("yn_obj", "yn_verb", "obj_exist")
MC_SETS = ("mc_obj", "mc_verb")


def _last_layer(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame.layer == frame.layer.max()] if len(frame) else frame


def _panel(axis, frame: pd.DataFrame, column: str, title: str) -> None:
    """Density of ``column``, correct vs hallucinated, with counts and means in the legend."""
    values = frame[[column, "correct"]].dropna()
    for correct, label, colour in ((True, "correct", "tab:blue"), (False, "hallucinated", "tab:red")):
        part = values[values.correct == correct][column].to_numpy(dtype=float)
        if len(part):
            axis.hist(part, bins=BINS, density=True, alpha=0.5, color=colour,
                      label=f"{label} (n={len(part)}, mean {part.mean():.3f})")
    axis.set_xlim(0, 1)
    axis.set_xlabel(column.replace("_", " "))
    axis.set_ylabel("density")
    fit_title(axis, title)
    if values.empty:
        axis.text(0.5, 0.5, "no rows", ha="center", va="center", transform=axis.transAxes)
    else:
        legend_below(axis, axis.get_legend_handles_labels()[0])  # under the panel: the n and means stay readable


def _figure(panels: list[tuple[pd.DataFrame, str, str]], title: str, note: str, path: str | Path) -> None:
    """The panels on a page, at most three a row (verbmirage.analysis.figure_layout), saved as PNG, PDF, SVG."""
    with page_style():
        figure, axes = page_figure(len(panels), panel_height=2.9, heading=title + (f"\n{note}" if note else ""))
        for axis, (frame, column, panel_title) in zip(axes, panels):
            _panel(axis, frame, column, panel_title)
        save_figure(figure, path)


def _yn_mc_panels(rows: pd.DataFrame) -> list[tuple[pd.DataFrame, str, str]]:
    yn, mc = rows[rows.qset.isin(YN_SETS)], rows[rows.qset.isin(MC_SETS)]
    return [(yn[yn.answer == "yes"], "visual_share", "YN, ground truth yes"),
            (yn[yn.answer == "no"], "visual_share", "YN, ground truth no"),
            (mc, "visual_share", "MC")]


def _per_set_panels(rows: pd.DataFrame) -> list[tuple[pd.DataFrame, str, str]]:
    panels = []
    order = {qset: i for i, qset in enumerate(YN_SETS + MC_SETS)}
    for qset in sorted(rows.qset.unique(), key=lambda q: (order.get(q, len(order)), q)) or ["(none)"]:
        part = rows[rows.qset == qset]
        if qset in YN_SETS:
            panels += [(part[part.answer == answer], "visual_share", f"{qset}, ground truth {answer}")
                       for answer in ("yes", "no")]
        else:
            panels.append((part, "visual_share", qset))
    return panels


#: The model family each figure shows in the paper.
PAPER_ROLES = {7: "llava", 8: "llava", 13: "llava", 14: "instructblip"}


def draw_attention_figures(table: pd.DataFrame, paths: dict[int, str | Path], roles: dict[int, str | None],
                           notes: dict[str, str] | None = None, condition: str = "clean",
                           backends: dict[str, str] | None = None) -> None:
    """Write Figs. 7, 8, 13, 14 (``paths``: figure number -> PNG, its PDF and SVG beside it) from the attention
    table.

    ``notes[model]`` is printed under the title (e.g. that a tiny model's weights are random);
    a model standing in for the paper's family (``backends``) is said so too.
    """
    notes, backends = notes or {}, backends or {}
    for number, path in paths.items():
        model = roles.get(number)
        rows = table[(table.model == model) & (table.condition == condition)]
        layer = int(rows.layer.max()) if len(rows) else None
        rows = _last_layer(rows)
        heading = (f"Fig. {number}: {FIGURES[number]} - {model or 'no model'}, {condition}, the last analysed "
                   f"layer (index {layer}, from 0)")
        note = notes.get(model, "") if model else "no attention model configured for this figure"
        if model and backends and backends.get(model) != PAPER_ROLES[number]:
            note = "; ".join(filter(None, [f"stands in for the paper's {PAPER_ROLES[number]} model "
                                           f"(none configured)", note]))
        if number == 7:
            yn_obj = rows[rows.qset == "yn_obj"]
            panels = [(yn_obj, "key_area_share", "(a) key-area share"), (yn_obj, "verb_share", "(b) verb share")]
        elif number == 13:
            panels = _per_set_panels(rows)
        else:
            panels = _yn_mc_panels(rows)
        _figure(panels, heading, note, path)
