"""The HTML report's own pages (``snakemake --report``, ``verbmirage report``), written by rule ``report_pages``
(where each result sits in the report: :mod:`verbmirage.workflow.report_items`):

- :func:`landing_html`: the landing page's headline, Table 1's accuracies for one row per model, ours beside
  the paper's (``report/workflow.rst`` includes it);
- :func:`run_facts_html`: the run's facts (config, data roots, models, versions) on a page of their own.
"""

from __future__ import annotations

import html
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

import pandas as pd
import yaml

from verbmirage.core.io import TABLE_STYLE, html_page, html_table
from verbmirage.evaluation.tables import HEADLINE_COLUMNS, PAPER, STAND_IN, headline_rows

# ---- the landing page's headline -----------------------------------------------------------------------------
#: the landing's columns: Table 1's accuracies, with the paper's short names
LANDING_COLUMNS = dict(zip(HEADLINE_COLUMNS, ("YN w/ obj", "YN verb only", "MC w/ obj", "MC verb only")))
#: the report's page sets the landing's column in the middle of the screen (Snakemake's own layout), which cuts
#: off the top of a page taller than the screen; this keeps the landing at the top and lets the table be wide
LANDING_STYLE = """
div.items-center.justify-center.h-screen { align-items: flex-start; }
div.py-2:has(.vm-landing) { flex: 0 0 auto; }
div.prose.max-w-lg:has(.vm-landing) { max-width: 48rem; }
.vm-landing table { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
.vm-landing th, .vm-landing td { border: 1px solid #c8c8c8; padding: 0.15em 0.5em; }
.vm-landing th { background: #f0f0f0; text-align: left; }
.vm-landing td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.vm-landing tr.paper td { background: #f7f7fb; }
.vm-landing tr.delta td { color: #555; font-style: italic; }
.vm-landing p { margin: 0.3em 0; }
"""


def landing_frame(table1: pd.DataFrame, variant_paper_names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The headline: per model one of our rows (:func:`~verbmirage.evaluation.tables.headline_rows`), right under
    it the paper's row of the same model and decoding and the difference, where Table 1 has them; then the
    paper's other rows. Accuracy in percent, no intervals (those are in Table 1); a stand-in's row is marked †."""
    lines = []
    used = set()
    for row, reference in headline_rows(table1, variant_paper_names):
        stand_in = isinstance(row.get("note"), str) and STAND_IN in row["note"]
        lines.append({"source": "ours", "model": row["model"] + (" †" if stand_in else ""),
                      "variant": row["variant"], **{label: row.get(column) for column, label in LANDING_COLUMNS.items()}})
        if reference is not None:
            used.add((reference["model"], reference["variant"]))
            lines.append({"source": PAPER, "model": reference["model"], "variant": reference["variant"],
                          **{label: reference.get(column) for column, label in LANDING_COLUMNS.items()}})
            lines.append({"source": "Δ (ours − paper)", "model": row["model"], "variant": row["variant"],
                          **{label: _signed(row.get(column), reference.get(column))
                             for column, label in LANDING_COLUMNS.items()}})
    for _, reference in table1[table1.source == PAPER].iterrows():
        if (reference["model"], reference["variant"]) not in used:
            lines.append({"source": PAPER, "model": reference["model"], "variant": reference["variant"],
                          **{label: reference.get(column) for column, label in LANDING_COLUMNS.items()}})
    return pd.DataFrame(lines, columns=["source", "model", "variant", *LANDING_COLUMNS.values()])


def _signed(ours, theirs) -> str | float:
    if ours is None or theirs is None or pd.isna(ours) or pd.isna(theirs):
        return float("nan")
    return f"{ours - theirs:+.2f}"


def run_line(config: Mapping) -> str:
    """The landing's first line, as HTML: each dataset's root as configured, and the models (every name from the
    config escaped here: the report's own text, ``report/workflow.rst``, holds none of them)."""
    roots = ", ".join(f"{html.escape(str(name))} from <code>{html.escape(str((entry or {}).get('root', '')))}</code>"
                      for name, entry in (config.get("datasets") or {}).items())
    models = ", ".join(html.escape(str(slug)) for slug in config.get("models") or {})
    return f"<p>Data: {roots or 'none'}; models: {models or 'none'}.</p>"


def landing_html(table1: pd.DataFrame | None, variant_paper_names: Mapping[str, str] | None = None,
                 stand_ins: Mapping[str, str] | None = None, condition: str = "clean",
                 config: Mapping | None = None) -> str:
    """The landing page's headline as an HTML fragment (``report/workflow.rst`` includes it): the run's data
    roots and models (:func:`run_line`, where ``config`` is given), Table 1's accuracies
    (:func:`landing_frame`), a line on how to read them, a note on the stand-ins. ``table1``: its Parquet, or
    None where the run has no Table 1 (no HICO)."""
    parts = [f"<style>{LANDING_STYLE}</style>", "<div class='vm-landing'>"]
    if config is not None:
        parts.append(run_line(config))
    if table1 is None:
        parts.append("<p>This run made no Table 1 (it needs the HICO dataset): the headline is in the tables "
                     "below.</p>")
    else:
        frame = landing_frame(table1, variant_paper_names)
        parts.append(f"<p><b>Table 1 at a glance</b> ({html.escape(condition)} HICO images): accuracy in %, one "
                     "row per model (its run in the paper's decoding, beam search, where it has one, else its first "
                     "variant), the paper's "
                     "rows (5-beam search) below ours. Precision, recall, the share of unknown answers and 95% "
                     "intervals: Table 1 under <i>Paper tables</i>.</p>")
        parts.append(html_table(frame).replace("<table>", "<table class='vm-headline'>", 1))
        marked = {model: reason for model, reason in (stand_ins or {}).items()
                  if (frame.model == f"{model} †").any()}
        if marked:
            listed = "; ".join(f"{html.escape(model)}: {html.escape(reason)}" for model, reason in marked.items())
            parts.append(f"<p>† {STAND_IN} ({listed}).</p>")
    parts.append("</div>")
    return "\n".join(parts) + "\n"


# ---- the run's facts -----------------------------------------------------------------------------------------
#: the packages whose versions decide the numbers, in the order shown
VERSIONED = ("verbmirage", "torch", "transformers", "accelerate", "peft", "tokenizers", "snakemake", "pandas",
             "numpy", "pyarrow", "scikit-learn", "scipy", "matplotlib", "pillow")


def package_versions(names: Sequence[str] = VERSIONED) -> dict[str, str]:
    """Installed versions (``not installed`` where absent), read from the package metadata (nothing imported)."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def pipeline_commit(repository: str | Path) -> str:
    """The pipeline checkout's git commit (``+ local changes`` where the tree differs from it), or why unknown."""
    def git(*arguments: str) -> str:
        return subprocess.run(["git", "-C", str(repository), *arguments], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown (not a git checkout: {type(error).__name__})"
    return commit + (" + local changes" if changed else "")


def _rows(pairs: Sequence[tuple[str, str]]) -> str:
    return "<table>\n" + "\n".join(f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>"
                                   for key, value in pairs) + "\n</table>"


def run_facts_html(config: Mapping, repository: str | Path, workdir: str | Path = ".",
                   stand_ins: Mapping[str, str] | None = None) -> str:
    """The run's facts as one HTML page: the pipeline's commit, Python and the package versions, the data roots
    (as configured and where they resolve from ``workdir``), the models (backend or how it is derived, its
    weights, the paper's model it stands for, why it is a stand-in: ``stand_ins``, derived models included),
    and the whole config as the run read it (defaults filled in)."""
    workdir = Path(workdir)
    environment = [("pipeline commit", pipeline_commit(repository)),
                   ("python", sys.version.split()[0]), ("platform", platform.platform()),
                   *package_versions().items()]
    roots = []
    for name, entry in (config.get("datasets") or {}).items():
        root = str((entry or {}).get("root", ""))
        where = (workdir / root).resolve() if root else None
        state = "" if where is None else f" -> {where}" + ("" if where.exists() else " (missing)")
        roots.append((name, f"{root}{state}"))
    models = []
    for slug, entry in (config.get("models") or {}).items():
        entry = entry or {}
        derive = entry.get("derive") or {}
        text = (f"{derive.get('method', '?')} of {derive.get('base', '?')}" if derive
                else f"backend {entry.get('backend', '?')}")
        weights = entry.get("path") or entry.get("model") or ""
        text += f", {weights}" if weights else ""
        if entry.get("paper_name"):
            text += f"; the paper's {entry['paper_name']}"
        reason = (stand_ins or {}).get(slug) or entry.get("stand_in")
        if reason:
            text += f"; {STAND_IN} ({reason})"
        models.append((slug, text))
    body = ["<h3>Software</h3>", _rows(environment), "<h3>Data roots</h3>",
            _rows(roots) if roots else "<p>none</p>", "<h3>Models</h3>", _rows(models) if models else "<p>none</p>",
            "<h3>Config (as the run read it, the schema's defaults filled in)</h3>",
            f"<pre>{html.escape(yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True))}</pre>"]
    style = TABLE_STYLE + "pre { background: #f7f7f7; padding: 0.8em; font-size: 0.85em; }\n"
    return html_page("\n".join(body), "The run's facts", style)


__all__ = ["landing_frame", "run_line", "landing_html", "package_versions", "pipeline_commit", "run_facts_html"]
