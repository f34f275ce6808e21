"""The demo's Snakemake report holds every figure and table the run made, and the paper figures exist."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from workflow_run import REPO

from verbmirage.analysis.paper_figures import bar_values, fig1_object_vs_verb
from verbmirage.io import METRICS, read_table

pytestmark = pytest.mark.slow

PAPER_FIGURES = ["fig1_object_vs_verb.png", "fig3_rare_common.png", "fig4b_error_consistency.png",
                 "fig5_ego_exo.png", "fig6_ambiguity.png"]


def test_paper_figures_exist_and_note_where_the_numbers_come_from(demo_run):
    folder = demo_run / "results" / "figures"
    for name in PAPER_FIGURES:  # the demo has CharadesEgo (Fig. 5), HICO-DET boxes (Fig. 6), salt-and-pepper (4b)
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    log = (demo_run / "logs" / "paper_figures.log").read_text()
    config = yaml.safe_load((demo_run / "config.yaml").read_text())
    if any(entry.get("paper_name") for entry in config["models"].values()):
        assert "diamonds: the paper's number (beam5)" in log
    else:  # the demo's tiny models stand for no paper model
        assert "no paper marks: no model has a paper_name" in log
    assert any("tiny_llava" in line and "RANDOM weights" in line for line in log.splitlines())


def test_fig1_bars_are_the_demo_metric_rows(demo_run):
    metrics = read_table(demo_run / "results/metrics/metrics.parquet", METRICS)
    bars = {key.split("|", 1)[1]: value for key, value in bar_values(fig1_object_vs_verb(metrics)).items()}
    clean = metrics[(metrics.dataset == "hico") & (metrics.condition == "clean") & (metrics.subset == "all")
                    & (metrics.metric == "accuracy") & (metrics.variant == "default")]
    expected = clean.set_index(["model", "qset"]).value
    assert bars["tiny_llava|YN w/ object (yn_obj)"] == pytest.approx(100 * expected["tiny_llava", "yn_obj"])
    assert bars["blind_vote|YN verb only (yn_verb)"] == pytest.approx(100 * expected["blind_vote", "yn_verb"])
    assert bars["prior|object existence (obj_exist, not POPE)"] == pytest.approx(100 * expected["prior", "obj_exist"])


def test_report_holds_every_figure_and_table(demo_run, tmp_path):
    figures = sorted((demo_run / "results" / "figures").glob("*.png"))
    tables = sorted((demo_run / "results" / "tables").glob("*.html"))
    assert {p.name for p in figures} >= set(PAPER_FIGURES)
    assert {"table1.html", "table2.html", "table3.html", "table4.html"} <= {p.name for p in tables}
    report = tmp_path / "report.html"
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(demo_run),
         "--configfile", str(demo_run / "config.yaml"), "--report", str(report)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # docutils reports a caption it cannot read (e.g. |x| taken as a substitution) on stderr, and the report
    # then shows its error message instead of the text
    assert not re.findall(r"\((?:WARNING|ERROR|SEVERE)/\d\).*", result.stderr)
    html = report.read_text()
    missing = [p.name for p in figures + tables if p.name not in html]
    assert not missing, f"not in the report: {missing}"
    for text in ("Paper figures", "Paper tables", "Not reproduced", "Fig. 4(a)"):
        assert text in html, text
