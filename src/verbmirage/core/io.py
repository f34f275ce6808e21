"""The one way tables are written and read (their schemas: :mod:`verbmirage.core.schemas`).

Every Parquet artifact of the workflow goes through :func:`write_table`: it
checks the columns against the declared schema, stamps provenance (package
version and the settings that produced the table) into the file metadata,
and writes atomically (:func:`verbmirage.core.paths.atomic_path`: temporary file, fsync, rename), so a
killed job or a crashed node never leaves a half-written table that a later job could read.
Files get the user's umask (not ``mkstemp``'s 0600), so a shared cluster
project can read them.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verbmirage import __version__
from verbmirage.core.paths import atomic_path, write_text
from verbmirage.core.schemas import DECODING_TABLE8, MITIGATION_TABLE5, PREDICTIONS


class SchemaError(ValueError):
    """A table does not have the columns its schema declares."""


class DamagedTableError(ValueError):
    """A file that should be a Parquet table cannot be read (empty, cut short, not Parquet); names the file."""


#: What a damaged table's error adds: how to get it back.
REBUILD_ADVICE = ("if the workflow wrote it, delete it and rerun: Snakemake builds it again (and what was made "
                  "from it); otherwise replace it")


def read_schema(path: str | Path) -> pa.Schema:
    """A Parquet file's schema (and metadata); :class:`DamagedTableError` naming the file when it is damaged."""
    try:
        return pq.read_schema(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as error:
        raise DamagedTableError(f"{path}: not a readable Parquet table ({error}); {REBUILD_ADVICE}") from None


def to_arrow(frame: pd.DataFrame, schema: pa.Schema, where: str = "table") -> pa.Table:
    """Cast a DataFrame to ``schema`` (column order and types), naming what is wrong.

    A column added to the schema later (``_ADDED_COLUMNS``) that ``frame`` lacks is written null.
    """
    frame = _with_added_columns(frame, schema)
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    try:
        return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise SchemaError(f"{where}: {error}") from error


def write_table(
    frame: pd.DataFrame,
    path: str | Path,
    schema: pa.Schema,
    provenance: dict | None = None,
    exclusive: bool = False,
) -> None:
    """Write ``frame`` as Parquet under ``schema``, atomically, with provenance metadata.

    The bytes depend only on the data and the provenance (no timestamps), so
    the same inputs give a byte-identical file. With ``exclusive`` an existing
    file is never replaced (``FileExistsError``).
    """
    path = Path(path)
    table = to_arrow(frame, schema, where=str(path))
    metadata = {
        b"verbmirage.version": __version__.encode(),
        b"verbmirage.provenance": json.dumps(provenance or {}, sort_keys=True, default=str).encode(),
    }
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    with atomic_path(path, replace=not exclusive) as tmp:
        pq.write_table(table, tmp)


def read_table(path: str | Path, schema: pa.Schema | None = None) -> pd.DataFrame:
    """Read a Parquet table; with ``schema``, check its columns, their types and (for questions) values.

    A table written by hand or by another tool can have the right column
    names and still lie: ``rare`` as the strings "True"/"False" makes every
    row rare, a capitalised answer is never correct. Each error names the
    file, the column and the first bad row.
    """
    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as error:  # pyarrow names no file for some damage (a cut footer)
        raise DamagedTableError(f"{path}: not a readable Parquet table ({error}); {REBUILD_ADVICE}") from None
    if schema is not None:
        added = _added_columns(schema)
        frame = _with_added_columns(frame, schema)  # a table written before such a column existed: null
        missing = [name for name in schema.names if name not in frame.columns]
        if missing:
            raise SchemaError(f"{path}: missing columns {missing}")
        stored = read_schema(path)
        check_types(stored, frame, pa.schema([f for f in schema if f.name in stored.names or f.name not in added]),
                    str(path))
        for declared, check in _VALUE_CHECKS:
            if schema.equals(declared):
                check(frame, str(path))
    return frame


def _same_kind(actual: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a stored type reads back as the declared one (widths and string flavours aside)."""
    if pa.types.is_null(actual):  # a column with no values at all
        return True
    if pa.types.is_dictionary(actual):  # a pandas categorical
        return _same_kind(actual.value_type, declared)
    for family in (pa.types.is_integer, pa.types.is_floating):
        if family(declared):
            return family(actual)
    if pa.types.is_string(declared) or pa.types.is_large_string(declared):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_list(declared) or pa.types.is_large_list(declared):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _same_kind(
            actual.value_type, declared.value_type
        )
    return actual.equals(declared)


def _first_value(frame: pd.DataFrame, column: str) -> str:
    """``row N (value)`` of the first non-empty cell, for an error message."""
    filled = frame[column].notna().to_numpy()
    if not filled.any():
        return "no values"
    row = int(filled.argmax())
    return f"row {row} ({frame[column].iloc[row]!r})"


def check_types(stored: pa.Schema, frame: pd.DataFrame, schema: pa.Schema, where: str) -> None:
    """Each declared column must be stored with the declared type (or a harmless equivalent)."""
    for field in schema:
        actual = stored.field(field.name).type
        if not _same_kind(actual, field.type):
            raise SchemaError(
                f"{where}: column '{field.name}', {_first_value(frame, field.name)}: "
                f"stored as {actual}, declared {field.type}"
            )


#: (schema, check of its values) that :func:`read_table` runs; added where the schema is declared
#: (:func:`add_value_check`), so that a module holding the schema holds its check too.
_VALUE_CHECKS: list = []


def add_value_check(schema: pa.Schema, check) -> None:
    """Have :func:`read_table` run ``check(frame, where)`` on every table read with ``schema``."""
    _VALUE_CHECKS.append((schema, check))


# (schema, nullable columns added after tables were written with it): an older table reads with them null,
# and a writer that does not know them yet writes them null.
_ADDED_COLUMNS = [(PREDICTIONS, ("yes_margin", "yes_mass", "vcd_kl", "vcd_plausible", "vcd_kl_reverse",
                                 "image_sha256")),
                  (MITIGATION_TABLE5, ("note",)),
                  (DECODING_TABLE8, ("note", *(f"{q}_unknown{end}" for q in ("yn_obj", "yn_verb", "mc_obj", "mc_verb")
                                               for end in ("", "_ci_low", "_ci_high"))))]


def _added_columns(schema: pa.Schema) -> tuple[str, ...]:
    return next((names for declared, names in _ADDED_COLUMNS if schema.equals(declared)), ())


def _with_added_columns(frame: pd.DataFrame, schema: pa.Schema) -> pd.DataFrame:
    """``frame`` with each later-added column of ``schema`` it lacks, as nulls."""
    absent = [name for name in _added_columns(schema) if name not in frame.columns]
    if not absent:
        return frame
    frame = frame.copy()
    for name in absent:
        frame[name] = pd.Series(None, index=frame.index, dtype=schema.field(name).type.to_pandas_dtype())
    return frame


def read_provenance(path: str | Path) -> dict:
    """The settings stamped into a table by :func:`write_table`."""
    metadata = read_schema(path).metadata or {}
    return json.loads(metadata.get(b"verbmirage.provenance", b"{}"))


def write_parquet(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a table that has no declared schema (a statistics or report table) as Parquet, atomically."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


#: How tables print a missing or undefined value (no run, or a metric whose denominator is 0).
MISSING_VALUE = "–"


def write_markdown(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Write a table as Markdown (via tabulate), atomically; NaN prints as ``MISSING_VALUE``."""
    cells = frame.astype(object).where(frame.notna(), None)  # tabulate's missingval applies to None only
    table = cells.to_markdown(index=False, floatfmt=".2f", missingval=MISSING_VALUE)
    write_text(path, (f"## {title}\n\n" if title else "") + table + "\n")


#: the look of every HTML table (ours): ruled rows, digits aligned in right-aligned numeric cells, a value's
#: 95% interval on its own, smaller line, the paper's rows and the differences set apart
TABLE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #c8c8c8; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f0f0f0; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td .ci { display: block; color: #666; font-size: 0.85em; }
td.note { min-width: 24em; font-size: 0.85em; }
td.long { min-width: 24em; }
tr.paper td { background: #f7f7fb; }
tr.delta td { color: #555; font-style: italic; }
"""
_NUMERIC = re.compile(r"^[-+−–]?\d[\d.,]*(?: \[[^\]]*\])?$|^–$")
_INTERVAL = re.compile(r"^(\S+) (\[[^\]]*\])$")


#: A text cell this long gets room (``td.long``): in a narrow column its words would stack a line each.
_LONG_TEXT = 60


def _html_cell(text: str) -> str:
    escaped = html.escape(text)
    if not _NUMERIC.match(text):
        return f"<td class='long'>{escaped}</td>" if len(text) > _LONG_TEXT else f"<td>{escaped}</td>"
    split = _INTERVAL.match(escaped)
    body = f"{split.group(1)}<span class='ci'>{split.group(2)}</span>" if split else escaped
    return f"<td class='num'>{body}</td>"


def html_table(frame: pd.DataFrame) -> str:
    """A table's ``<table>`` markup in :data:`TABLE_STYLE`'s classes: numbers right-aligned with their interval
    on a line of its own, the paper's rows and Δ rows marked (a ``source`` column tells them apart)."""
    cells = frame.astype(object).where(frame.notna(), None)
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in frame.columns)
    rows = []
    for record in cells.itertuples(index=False):
        values = [MISSING_VALUE if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v)) for v in record]
        source = dict(zip(frame.columns, values)).get("source", "")
        kind = " class='paper'" if source == "paper" else " class='delta'" if source.startswith("Δ") else ""
        cells_html = [_html_cell(v) if column != "note" else f"<td class='note'>{html.escape(v)}</td>"
                      for column, v in zip(frame.columns, values)]
        rows.append(f"<tr{kind}>" + "".join(cells_html) + "</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>"


def html_page(body: str, title: str = "", style: str = TABLE_STYLE) -> str:
    """A small standalone HTML page (UTF-8) around ``body``, with ``title`` as its heading where given."""
    heading = f"<h2>{html.escape(title)}</h2>\n" if title else ""
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n{heading}{body}\n</body></html>\n")


def write_html(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Write a table as a small standalone HTML page (for the Snakemake report), atomically (:func:`html_table`,
    :func:`html_page`)."""
    write_text(path, html_page(html_table(frame), title))
