"""The HTML report (``snakemake --report``, ``verbmirage report``): where each result sits in it, and the report's
own pages.

Every file the rules mark for the report has one :class:`ReportItem` here (:data:`REPORT_ITEMS`): its category,
its place in the paper's order, the paper's item it reproduces and its caption file under ``report/``. The
rules take all of it from :func:`report_options`, so the report's order is written once, here. Inside a
category the report sorts its results by their first label, so that label is the paper's order (``01``,
``02``, ...; a figure drawn in parts ``03a``, ``03b``; one whose number of pages depends on the config, as
Fig. 10's, has one entry with ``{part}`` for the page's letter).

The report's own pages, written by rule ``report_pages``:

- :func:`landing_html`: the landing page's headline, Table 1's accuracies for one row per model, ours beside
  the paper's (``report/workflow.rst`` includes it);
- :func:`run_facts_html`: the run's facts (config, data roots, models, versions) on a page of their own.
"""

from __future__ import annotations

import html
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

import pandas as pd
import yaml

from verbmirage.core.io import TABLE_STYLE, html_page, html_table
from verbmirage.evaluation.tables import HEADLINE_COLUMNS, PAPER, STAND_IN, headline_rows

TABLES, FIGURES, ANALYSES, RUN = "Paper tables", "Paper figures", "Analyses", "Run facts"


@dataclass(frozen=True)
class ReportItem:
    category: str
    rank: int  # its place in the category: the paper's order
    paper: str  # the paper's item it reproduces ("Table 1", "Fig. 4(b)", "App. A"), or "ours"
    shows: str
    caption: str  # its caption file in report/
    part: str = ""  # a figure drawn in parts: this part's letter

    @property
    def labels(self) -> dict[str, str]:
        """The report's columns for it; the first sorts the category (string order, hence the zeros; a part's
        letter after its figure's number)."""
        return {"no.": f"{self.rank:02d}{self.part}", "paper": self.paper, "shows": self.shows}


#: Every file the report shows, by the end of its path inside the results folder.
REPORT_ITEMS: dict[str, ReportItem] = {
    "tables/table1.html": ReportItem(TABLES, 1, "Table 1", "YN and MC questions, with and without the object named",
                                     "table.rst"),
    "tables/table2.html": ReportItem(TABLES, 2, "Table 2", "clean vs distorted images; error consistency",
                                     "table.rst"),
    "tables/table3.html": ReportItem(TABLES, 3, "Table 3", "majority-vote ensembles vs their members", "table.rst"),
    "tables/table4.html": ReportItem(TABLES, 4, "Table 4", "CharadesEgo: egocentric vs exocentric views",
                                     "table.rst"),
    "tables/table5.html": ReportItem(TABLES, 5, "Table 5", "mitigation methods", "table5_mitigation.rst"),
    "tables/table6.html": ReportItem(TABLES, 6, "Table 6", "overlap of the influential object sets",
                                     "table6_object_reliance.rst"),
    "tables/table7.html": ReportItem(TABLES, 7, "Table 7", "verbs' influence on the answers",
                                     "table7_verb_influence.rst"),
    "tables/table8.html": ReportItem(TABLES, 8, "Table 8", "decoding strategies", "table8_decoding.rst"),
    "benchmark/hico/counts.html": ReportItem(TABLES, 9, "App. A", "HICO question counts", "counts.rst"),
    "benchmark/charadesego/counts.html": ReportItem(TABLES, 10, "App. A", "CharadesEgo question counts",
                                                    "counts.rst"),
    "figures/fig1_object_vs_verb.png": ReportItem(FIGURES, 1, "Fig. 1", "object vs verb hallucination",
                                                  "fig1_object_vs_verb.rst"),
    "figures/fig3a_rare_common.png": ReportItem(FIGURES, 3, "Fig. 3", "rare vs common verbs: answer No",
                                                "fig3_rare_common.rst", "a"),
    "figures/fig3b_rare_common.png": ReportItem(FIGURES, 3, "Fig. 3", "rare vs common verbs: answer Yes (ours)",
                                                "fig3_rare_common.rst", "b"),
    "figures/fig4b_error_consistency.png": ReportItem(FIGURES, 4, "Fig. 4(b)", "error consistency: objects vs verbs",
                                                      "fig4b_error_consistency.rst"),
    "figures/fig5_ego_exo.png": ReportItem(FIGURES, 5, "Fig. 5", "egocentric vs exocentric (MC)", "fig5_ego_exo.rst"),
    "figures/fig6a_ambiguity.png": ReportItem(FIGURES, 6, "Fig. 6", "ambiguous vs unambiguous images: any rule",
                                              "fig6_ambiguity.rst", "a"),
    "figures/fig6b_ambiguity.png": ReportItem(FIGURES, 6, "Fig. 6", "ambiguous vs unambiguous: size ratio, crowd",
                                              "fig6_ambiguity.rst", "b"),
    "figures/fig6c_ambiguity.png": ReportItem(FIGURES, 6, "Fig. 6",
                                              "ambiguous vs unambiguous: occlusion, invisible HOI",
                                              "fig6_ambiguity.rst", "c"),
    "figures/fig7_attention.png": ReportItem(FIGURES, 7, "Fig. 7", "key-area and verb attention",
                                             "attention_fig7.rst"),
    "figures/fig8_attention.png": ReportItem(FIGURES, 8, "Fig. 8", "visual token attention", "attention_fig8.rst"),
    "figures/fig9_uncertainty.png": ReportItem(FIGURES, 9, "Fig. 9", "token uncertainty", "uncertainty_fig9.rst"),
    "figures/fig10{part}_fov.png": ReportItem(FIGURES, 10, "Fig. 10", "field of view and uncertainty",
                                              "fov_fig10.rst"),
    "figures/fig11_known_object_ap.png": ReportItem(FIGURES, 11, "Fig. 11", "Known-Object AP per HOI vs CLIP",
                                                    "known_object_fig11.rst"),
    "figures/fig12_uncertainty.png": ReportItem(FIGURES, 12, "Fig. 12", "token uncertainty, second model",
                                                "uncertainty_fig12.rst"),
    "figures/fig13_attention.png": ReportItem(FIGURES, 13, "Fig. 13", "visual token attention, more sets",
                                              "attention_fig13.rst"),
    "figures/fig14_attention.png": ReportItem(FIGURES, 14, "Fig. 14", "visual token attention, second model",
                                              "attention_fig14.rst"),
    "figures/fig15_object_reliance.png": ReportItem(FIGURES, 15, "Fig. 15", "YN accuracy with vs without the object",
                                                    "fig15_object_reliance.rst"),
    "analysis/attention_summary.html": ReportItem(ANALYSES, 1, "Figs. 7, 8, 13, 14", "attention: the numbers",
                                                  "attention_summary.rst"),
    "tables/fov.html": ReportItem(ANALYSES, 2, "Fig. 10", "field of view: the numbers", "fov_table.rst"),
    "analysis/vcd_divergence.html": ReportItem(ANALYSES, 3, "VCD (mitigation)", "VCD divergence: KL = 0 and flips",
                                               "vcd_divergence_table.rst"),
    "figures/vcd_divergence.png": ReportItem(ANALYSES, 4, "VCD (mitigation)", "VCD divergence: the KL distribution",
                                             "vcd_divergence.rst"),
    "report/run_facts.html": ReportItem(RUN, 1, "ours", "config, data roots, models, versions", "run_facts.rst"),
}


def report_item(path: str | Path) -> ReportItem:
    """The :class:`ReportItem` of a file marked for the report; a KeyError naming it and :data:`REPORT_ITEMS`."""
    text = Path(path).as_posix()
    found = [item for end, item in REPORT_ITEMS.items() if text == end or text.endswith(f"/{end}")]
    for end, item in REPORT_ITEMS.items():  # a page of a figure with a page per few models: {part} its letter
        page = re.fullmatch(rf"(?:.*/)?{re.escape(end).replace(re.escape('{part}'), '(?P<part>[a-z])')}", text)
        if "{part}" in end and page:
            found.append(replace(item, part=page.group("part")))
    if not found:
        raise KeyError(f"{path} is marked for the report but has no entry in verbmirage.workflow.report_pages."
                       "REPORT_ITEMS (its category, its place in the paper's order, its caption)")
    return found[0]


def is_reported(path: str | Path) -> bool:
    """Whether the report shows ``path`` (it has a :data:`REPORT_ITEMS` entry)."""
    try:
        report_item(path)
    except KeyError:
        return False
    return True


def report_options(path: str | Path, captions: str = "../report") -> dict:
    """The keyword arguments of Snakemake's ``report()`` for ``path``: category, labels, caption (in
    ``captions``, relative to the rule files). A path with wildcards (``benchmark/{dataset}/counts.html``)
    stands for every item its pattern matches; its labels are then picked per job from its wildcards."""
    text = Path(path).as_posix()
    if "{" not in text:
        item = report_item(text)
        return {"category": item.category, "labels": item.labels, "caption": f"{captions}/{item.caption}"}
    parts = text.split("/")

    def fits(end: str) -> bool:  # the pattern's last path parts, each {wildcard} any one folder name, are end
        tail = "/".join(parts[-len(end.split("/")):])
        return re.fullmatch(re.sub(r"\\{\w+\\}", "[^/]+", re.escape(tail)), end) is not None

    matches = [item for end, item in REPORT_ITEMS.items() if fits(end)]
    if not matches:
        raise KeyError(f"{path} is marked for the report but matches no entry of verbmirage.workflow.report_pages."
                       "REPORT_ITEMS")
    item = matches[0]

    def labels(wildcards) -> dict[str, str]:
        return report_item(text.format(**dict(wildcards.items()))).labels

    return {"category": item.category, "labels": labels, "caption": f"{captions}/{item.caption}"}


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


__all__ = ["REPORT_ITEMS", "ReportItem", "report_item", "is_reported", "report_options", "landing_frame", "run_line",
           "landing_html", "package_versions", "pipeline_commit", "run_facts_html"]
