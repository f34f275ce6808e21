"""The paper's published numbers (``paper_tables.csv``) and which of our models they belong to.

The file is long form, one number per row: ``table, model, variant, qset, condition, metric, value``
(percent; kappa x100). A copy ships with the package (:func:`packaged_paper_numbers`); the tables put
its rows beside ours and the figures mark its numbers.

Our model slugs are not the paper's names: a model stands for a paper model only where its entry
says so (``models.<slug>.paper_name``); an ensemble stands for the paper's ensemble when its members
stand for the paper's three members (Table 3).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("table", "model", "variant", "qset", "condition", "metric", "value")

#: the paper's one ensemble (Table 3), by the paper names of its members.
PAPER_ENSEMBLES = {
    frozenset({"MiniCPM-Llama3-V2.5", "Qwen-VL-Chat", "InstructBLIP-7B"}):
        "Ensemble(MiniCPM,Qwen-VL-Chat,InstructBLIP)",
}
#: the paper's default decoding (Table 1 = Table 8's beam-search column).
PAPER_VARIANT = "beam5"


def empty_paper_numbers() -> pd.DataFrame:
    import pandas as pd  # deferred: the run plan reads the pairing rule below, never the numbers

    return pd.DataFrame({column: pd.Series(dtype=float if column == "value" else str) for column in COLUMNS})


def load_paper_numbers(path: str | Path | None) -> pd.DataFrame:
    """The paper's numbers, or an empty table when ``path`` is empty or absent (figures then carry no marks).

    A file that is there but malformed is an error naming the file and the row.
    """
    import pandas as pd  # deferred: the run plan reads the pairing rule below, never the numbers

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
    return Path(__file__).with_name("paper_tables.csv")


def paper_names_from_config(config: dict, method_rows: bool = False, derived: dict | None = None) -> dict[str, str]:
    """Our slug -> the paper's model whose published rows its rows are paired with: the one pairing rule of
    every table and figure (Tables 1-5 and 8, the paper figures' marks, Fig. 11, the VCD divergence).

    A model entry stands for the paper's model its ``paper_name`` names. An entry with ``paper_method`` (a
    derived or fine-tuned model: Table 5's Nullu, REVERIE, HaloQuest, Octopus and Pangea-LoRA rows) is that
    method applied to a base model, not the base model itself, so without ``method_rows`` it pairs with
    nothing (a Nullu model's Table 1 row or figure bar gets no paper number). With ``method_rows`` (Table 5's
    method rows) it pairs with the paper's model its *base* is: the ``paper_name`` of ``derive.base``'s entry
    for a derived model, of the entry itself for any other (an adapter on its own ``path``). A derived entry's
    ``derive`` block is its own, or ``derived[slug]`` (the workflow's entries, once replaced by the entries
    their jobs load). An ensemble whose members are the paper's three ensemble members stands for the
    paper's ensemble.
    """
    models = config["models"]
    names = {slug: entry["paper_name"] for slug, entry in models.items()
             if entry.get("paper_name") and not entry.get("paper_method")}
    for slug, members in (config.get("ensembles") or {}).items():
        member_names = frozenset(names.get(member, "") for member in members)
        if member_names in PAPER_ENSEMBLES:
            names[slug] = PAPER_ENSEMBLES[member_names]
    if method_rows:
        for slug, entry in models.items():
            if entry.get("paper_method"):
                derive = (derived or {}).get(slug) or entry.get("derive")
                base = models.get(derive.get("base"), {}) if derive else entry
                if base.get("paper_name"):
                    names[slug] = base["paper_name"]
    return names
