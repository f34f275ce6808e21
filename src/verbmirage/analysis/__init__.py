"""Analyses that look inside the models or across runs (docs/analysis.md).

Public face:

- :mod:`verbmirage.analysis.attention`: visual-token, verb-token and key-area
  attention at the answer position (:func:`run_attention`, :func:`question_shares`,
  the box-to-token grids :func:`token_grid`, :func:`clip_style_grid`, :func:`qwen_grid`).
- :mod:`verbmirage.analysis.attention_figures`: the paper's Figs. 7, 8, 13 and 14 from
  ``results/analysis/attention.parquet``.
- :mod:`verbmirage.analysis.uncertainty`: the answer token's probability, correct vs hallucinated
  (:func:`~verbmirage.analysis.uncertainty.uncertainty_tables`; Figs. 9, 12), and
  :mod:`verbmirage.analysis.fov`: full image vs crops on the same questions
  (:func:`~verbmirage.analysis.fov.fov_tables`; Fig. 10); their figures in
  :mod:`verbmirage.analysis.uncertainty_figures`.
- :mod:`verbmirage.analysis.paper_figures`: the paper's Figs. 1, 3, 4(b), 5 and 6 from the metrics
  table, the paper's numbers (:mod:`verbmirage.evaluation.paper_numbers`) marked where it prints one.
- :mod:`verbmirage.analysis.object_reliance`: answers with vs without the object named, per object
  and per verb (:func:`~verbmirage.analysis.object_reliance.object_reliance`; Fig. 15, Tables 6 and 7).

- :mod:`verbmirage.analysis.vcd_divergence`: why VCD barely moves the answers: the share of questions
  whose stored KL is exactly 0, its distribution, and the decisions VCD flips against the plain variant
  (:func:`~verbmirage.analysis.vcd_divergence.vcd_divergence_tables`).

Each analysis reads its settings from the config in a light module of its own (``*_settings``), which the run
plan imports; the names below are imported on first use, so that doing so loads neither numpy nor pandas.
"""

from __future__ import annotations

import importlib

_FACE = {**dict.fromkeys(["AttentionProbe", "TokenGrid", "TokenSets", "clip_style_grid", "head_shares", "qwen_grid",
                          "question_shares", "run_attention", "token_grid"], "attention"),
         "AttentionError": "attention_settings"}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
