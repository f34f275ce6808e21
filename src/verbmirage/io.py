"""Table schemas, declared once, and the one way tables are written.

Every Parquet artifact of the workflow goes through :func:`write_table`: it
checks the columns against the declared schema, stamps provenance (package
version and the settings that produced the table) into the file metadata,
and writes atomically (temporary file + rename), so a killed job never
leaves a half-written table that a later job could read.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verbmirage import __version__

QUESTIONS = pa.schema(
    [
        ("question_id", pa.string()),
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("image_id", pa.string()),
        ("image", pa.string()),
        ("verb", pa.string()),
        ("object", pa.string()),
        ("hoi_id", pa.int64()),
        ("prompt", pa.string()),
        ("options", pa.list_(pa.string())),
        ("answer", pa.string()),
        ("group_id", pa.string()),
        ("rotation", pa.int64()),
        ("rare", pa.bool_()),
        ("common", pa.bool_()),
    ]
)

PREDICTIONS = pa.schema(
    [
        ("question_id", pa.string()),
        ("raw_answer", pa.string()),
        ("prediction", pa.string()),
        ("parse_rule", pa.string()),
        ("p_yes", pa.float64()),
        ("option_probs", pa.list_(pa.float64())),
        ("confidence", pa.float64()),
        ("error", pa.string()),
    ]
)

METRICS = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("subset", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n", pa.int64()),
    ]
)

QUESTION_COUNTS = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("rows", pa.int64()),
        ("unique_questions", pa.int64()),
        ("images", pa.int64()),
        ("yes", pa.int64()),
        ("no", pa.int64()),
        ("paper_unique_questions", pa.int64()),
        ("paper_yes_to_no", pa.string()),
    ]
)


class SchemaError(ValueError):
    """A table does not have the columns its schema declares."""


def to_arrow(frame: pd.DataFrame, schema: pa.Schema, where: str = "table") -> pa.Table:
    """Cast a DataFrame to ``schema`` (column order and types), naming what is wrong."""
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    try:
        return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise SchemaError(f"{where}: {error}") from error


def write_table(
    frame: pd.DataFrame, path: str | Path, schema: pa.Schema, provenance: dict | None = None
) -> None:
    """Write ``frame`` as Parquet under ``schema``, atomically, with provenance metadata.

    The bytes depend only on the data and the provenance (no timestamps), so
    the same inputs give a byte-identical file.
    """
    path = Path(path)
    table = to_arrow(frame, schema, where=str(path))
    metadata = {
        b"verbmirage.version": __version__.encode(),
        b"verbmirage.provenance": json.dumps(provenance or {}, sort_keys=True, default=str).encode(),
    }
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_table(path: str | Path, schema: pa.Schema | None = None) -> pd.DataFrame:
    """Read a Parquet table; with ``schema``, check it has the declared columns."""
    frame = pd.read_parquet(path)
    if schema is not None:
        missing = [name for name in schema.names if name not in frame.columns]
        if missing:
            raise SchemaError(f"{path}: missing columns {missing}")
    return frame


def read_provenance(path: str | Path) -> dict:
    """The settings stamped into a table by :func:`write_table`."""
    metadata = pq.read_schema(path).metadata or {}
    return json.loads(metadata.get(b"verbmirage.provenance", b"{}"))


def _write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_markdown(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Write a table as Markdown (via tabulate), atomically."""
    _write_text(path, (f"## {title}\n\n" if title else "") + frame.to_markdown(index=False, floatfmt=".2f") + "\n")


def write_html(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Write a table as a small standalone HTML page (for the Snakemake report), atomically."""
    body = frame.to_html(index=False, float_format=lambda v: f"{v:.2f}", na_rep="", border=0)
    heading = f"<h2>{title}</h2>\n" if title else ""
    _write_text(path, f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>"
                      f"<body>\n{heading}{body}\n</body></html>\n")
