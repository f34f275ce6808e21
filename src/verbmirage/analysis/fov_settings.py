"""What the field-of-view analysis reads from the config (``analysis.fov``; paper Fig. 10): the question sets
and conditions it compares, and how many pages its figure takes. The run plan imports this; the tables are made
by :mod:`verbmirage.analysis.fov`, the figure by :mod:`verbmirage.analysis.uncertainty_figures`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from verbmirage.analysis.figure_layout import MAX_COLUMNS, rows_per_page
from verbmirage.core.errors import ConfigError


@dataclass(frozen=True)
class FovSettings:
    """Config ``analysis.fov``: the question sets and conditions compared (the first is the reference)."""

    qsets: tuple[str, ...] = ("mc_obj", "mc_verb")
    conditions: tuple[str, ...] = ("clean", "crop")


def fov_settings(config: dict, asked: Mapping[str, Iterable[str]]) -> FovSettings | None:
    """The checked ``analysis.fov`` block, or None when it is absent.

    ``asked``: condition -> the HICO question sets asked under it (``conditions.<slug>.qsets``).
    """
    block = (config.get("analysis") or {}).get("fov")
    if block is None:
        return None
    settings = FovSettings(tuple(block.get("qsets", FovSettings.qsets)),
                           tuple(block.get("conditions", FovSettings.conditions)))
    if not config["datasets"]["hico"].get("det_root"):
        raise ConfigError("analysis.fov: the field-of-view questions are the single-instance images of "
                          "HICO-DET; set datasets.hico.det_root")
    unknown = sorted(set(settings.conditions) - set(config["conditions"]))
    if unknown:
        raise ConfigError(f"analysis.fov.conditions: {unknown} are not in conditions: "
                          f"(known: {sorted(config['conditions'])})")
    if len(settings.conditions) < 2:
        raise ConfigError("analysis.fov.conditions: name the full image (first) and at least one crop")
    for condition in settings.conditions:
        missing = [q for q in settings.qsets if q not in set(asked[condition])]
        if missing:
            raise ConfigError(f"analysis.fov.qsets: {missing} are not asked under condition {condition} "
                              f"(conditions.{condition}.qsets)")
    return settings


FOV_PANEL_HEIGHT = 3.0  # inches: a panel of Fig. 10


def fov_columns(n_qsets: int) -> int:
    """Fig. 10's columns: a model's question sets side by side, at most three a row, its rows equally full."""
    n_qsets = max(1, n_qsets)
    return math.ceil(n_qsets / math.ceil(n_qsets / MAX_COLUMNS))


def fov_pages(models: Sequence[str], n_qsets: int) -> list[list[str]]:
    """Fig. 10's pages: the models each shows, in order, as many as their rows (a model's ``n_qsets`` sets,
    :func:`fov_columns` a row) fit a page (:func:`~verbmirage.analysis.figure_layout.rows_per_page`); one page
    showing no model where there are none. The plan names a file per page from this (``fig10a_fov``, ...)."""
    rows = math.ceil(max(1, n_qsets) / fov_columns(n_qsets))
    per_page = max(1, rows_per_page(FOV_PANEL_HEIGHT) // rows)
    models = list(models)
    return [models[start:start + per_page] for start in range(0, len(models), per_page)] or [[]]
