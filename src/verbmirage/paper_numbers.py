"""The paper's published numbers (``paper_tables.csv``) and which of our models they belong to.

The file is long form, one number per row: ``table, model, variant, qset, condition, metric, value``
(percent; kappa x100). It lives outside the project (``../shared/data/paper_tables.csv`` beside the
repository); figures mark its numbers where one exists and are drawn without marks when it is absent.

Our model slugs are not the paper's names: a model stands for the paper model of its backend
(``PAPER_MODELS``; a ``llava`` backend is "LLaVA-1.5-7B", whatever its size), unless the config
names one explicitly. An ensemble stands for the paper's ensemble when its members stand for the
paper's three members (Table 3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

COLUMNS = ("table", "model", "variant", "qset", "condition", "metric", "value")

#: backend -> the paper's model name (paper Table 1; Qwen2.5-VL from Appendix F).
PAPER_MODELS = {
    "llava": "LLaVA-1.5-7B",
    "instructblip": "InstructBLIP-7B",
    "qwen2_vl": "Qwen2-VL-7B",
    "qwen2_5_vl": "Qwen2.5-VL-7B",
    "qwen_vl_chat": "Qwen-VL-Chat",
    "minicpm_v": "MiniCPM-Llama3-V2.5",
    "mplug_owl2": "mPLUG-Owl2",
    "molmo": "Molmo-7B-D",
}
#: the paper's one ensemble (Table 3), by the paper names of its members.
PAPER_ENSEMBLES = {
    frozenset({"MiniCPM-Llama3-V2.5", "Qwen-VL-Chat", "InstructBLIP-7B"}): "Ensemble(MiniCPM,Qwen-VL-Chat,InstructBLIP)",
}
#: the paper's default decoding (Table 1 = Table 8's beam-search column).
PAPER_VARIANT = "beam5"


def empty_paper_numbers() -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype=float if column == "value" else str) for column in COLUMNS})


def load_paper_numbers(path: str | Path | None) -> pd.DataFrame:
    """The paper's numbers, or an empty table when ``path`` is empty or absent (figures then carry no marks).

    A file that is there but malformed is an error naming the file and the row.
    """
    if not path or not Path(path).is_file():
        return empty_paper_numbers()
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [column for column in COLUMNS if column not in frame]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    values = pd.to_numeric(frame["value"], errors="coerce")
    bad = values.isna()
    if bad.any():
        row = int(bad.idxmax())
        raise ValueError(f"{path}: row {row + 2} has a non-numeric value {frame['value'][row]!r}")
    return frame[list(COLUMNS)].assign(value=values.astype(float))


def paper_model_names(
    backends: Mapping[str, str],
    ensembles: Mapping[str, list[str]] | None = None,
    chosen: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Our slug -> the paper's model name, for the models (and ensembles) the paper has.

    ``backends``: slug -> backend; ``chosen`` (config) overrides the backend rule, per slug.
    """
    unknown = sorted(set(chosen or {}) - set(backends) - set(ensembles or {}))
    if unknown:
        raise ValueError(f"analysis.paper_figures.paper_models: {unknown} are not slugs of models: or ensembles:")
    names = {slug: PAPER_MODELS[backend] for slug, backend in backends.items() if backend in PAPER_MODELS}
    names.update(chosen or {})
    for slug, members in (ensembles or {}).items():
        member_names = frozenset(names.get(member, "") for member in members)
        if slug not in names and member_names in PAPER_ENSEMBLES:
            names[slug] = PAPER_ENSEMBLES[member_names]
    return names


def paper_value(
    paper: pd.DataFrame, model: str | None, qset: str, condition: str, metric: str, variant: str = PAPER_VARIANT
) -> float:
    """One published number (percent, as printed), or NaN where the paper has none.

    Tables repeat numbers (Table 3's members are Table 1's rows): the first table's value is taken.
    """
    if not model or paper.empty:
        return math.nan
    match = paper[
        (paper.model == model) & (paper.variant == variant) & (paper.qset == qset)
        & (paper.condition == condition) & (paper.metric == metric)
    ]
    return float(match.value.iloc[0]) if len(match) else math.nan


def packaged_paper_numbers() -> Path:
    """The paper's published numbers as shipped with the package (a copy of ``paper_tables.csv``)."""
    return Path(__file__).with_name("data") / "paper_tables.csv"


def paper_names_from_config(config: dict) -> dict[str, str]:
    """Our slug -> the paper's model name, only where a model entry says so (``paper_name``); an ensemble
    whose members are the paper's three ensemble members stands for the paper's ensemble."""
    names = {slug: entry["paper_name"] for slug, entry in config["models"].items() if entry.get("paper_name")}
    for slug, members in (config.get("ensembles") or {}).items():
        member_names = frozenset(names.get(member, "") for member in members)
        if member_names in PAPER_ENSEMBLES:
            names[slug] = PAPER_ENSEMBLES[member_names]
    return names
