"""The report as a file (verbmirage.workflow.report_file): one per config, and nothing of a config runs as script."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from verbmirage.workflow.report_file import DATA_BLOCKS, ReportError, report_command, report_path, seal_script_data
from verbmirage.workflow.run_folders import RunFolders

PROBE = "<script>alert(1)</script>"
FOLDER = "<svg onload=alert(4)>"


def report_page(results: dict) -> str:
    """A page laid out as Snakemake's report template lays out its data: each block ``<script id=...>``, then
    ``var NAME = <json.dumps>;`` on one line (Snakemake writes the JSON verbatim)."""
    names = {"workflow-desc": "workflow_desc", "rulegraph": "rulegraph_spec", "runtimes": "runtimes_spec",
             "timeline": "timeline_spec", "logo": "logo_uri"}
    values = {"workflow-desc": f"<div><p>HICO from <code>{FOLDER}/hico</code></p></div>", "results": results,
              "logo": "data:image/svg+xml;base64,PD94"}
    blocks = [f'    <script id="{block}">\n    var {names.get(block, block)} = '
              f"{json.dumps(values.get(block, {}))};\n    </script>" for block in DATA_BLOCKS]
    return ("<!doctype html>\n<html>\n<head><script>var s = '<\\/script>';</script></head>\n<body>\n"
            '    <div id="app">\n    </div>\n\n' + "\n\n".join(blocks) + "\n</body>\n</html>")


class Scripts(HTMLParser):
    """The text of every <script> element as a browser's HTML parser splits the page, and every other tag."""

    def __init__(self, page: str):
        super().__init__()
        self.scripts, self.tags, self._inside = [], [], False
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self._inside = True
            self.scripts.append("")
        else:
            self.tags.append(tag)

    def handle_endtag(self, tag):
        self._inside = self._inside and tag != "script"

    def handle_data(self, data):
        if self._inside:
            self.scripts[-1] += data


def test_a_config_string_with_a_script_tag_stays_inside_its_data_block():
    results = {"results/tables/table1.html": {"caption": "<p>Table 1</p>", "job_properties": {
        "params": f"paper_names={{'prior': '{PROBE}'}}, stand_ins={{'random': '<i onmouseover=alert(5)>coin</i>'}}",
        "wildcards": ""}}, f"{FOLDER}/x.png": {"caption": "<p>x</p>", "job_properties": {}},
        "results/figures/fig1.png": {"job_properties": {"params": f"paper_names={{'prior': '{PROBE}'}}"}}}
    page = report_page(results)
    raw = Scripts(page)  # Snakemake's page as it is: the first probe ends its block, the second runs as a script
    assert "alert(1)" in raw.scripts and {"i", "svg"} <= set(raw.tags)

    sealed = seal_script_data(page)
    parsed = Scripts(sealed)
    assert len(parsed.scripts) == 1 + len(DATA_BLOCKS) and "svg" not in parsed.tags
    data = {}
    for script in parsed.scripts[1:]:
        name, value = script.strip().removeprefix("var ").split(" = ", 1)
        assert "<" not in value
        data[name] = json.loads(value.removesuffix(";"))
    assert data["results"] == results  # the same data for the page's JavaScript: "\u003c" is "<"
    assert data["workflow_desc"].startswith("<div><p>HICO from <code><svg onload")
    assert seal_script_data(sealed) == sealed


def test_a_report_whose_data_blocks_are_not_where_the_template_puts_them_is_refused():
    page = report_page({})
    with pytest.raises(ReportError, match=r'no <script id="timeline"> data block .* template changed'):
        seal_script_data(page.replace('<script id="timeline">', '<script id="timeline2">'))
    with pytest.raises(ReportError, match=r'<script id="results"> block is not one line of JSON'):
        seal_script_data(page.replace("var results = {}", 'var results = {"a": "</script>'))


def test_one_report_per_config_beside_its_results(tmp_path):
    workflow, workdir = tmp_path / "repo", tmp_path / "work"
    (workdir / "my").mkdir(parents=True)
    workflow.mkdir()
    (workdir / "config.yaml").write_text("models: {}\n")
    (workdir / "my" / "mini.yaml").write_text("models: {}\n")
    (workdir / "my" / "moved.yaml").write_text("results_dir: results/v2\n")
    (workdir / "my" / "away.yaml").write_text(f"results_dir: {tmp_path / 'scratch'}\n")
    assert str(report_path(None, workdir, workflow)) == "report.html"  # the demo's
    assert str(report_path("config.yaml", workdir, workflow)) == "report.html"
    assert str(report_path("my/mini.yaml", workdir, workflow)) == "results/mini/report.html"
    assert str(report_path("my/moved.yaml", workdir, workflow)) == "results/v2/report.html"
    assert report_path("my/away.yaml", workdir, workflow) == tmp_path / "scratch" / "report.html"
    assert RunFolders("results", "logs", "benchmarks").report == "report.html"
    with pytest.raises(ReportError, match=r"--configfile my/nope.yaml: cannot be read \(FileNotFoundError"):
        report_path("my/nope.yaml", workdir, workflow)
    (workdir / "my" / "bad name.yaml").write_text("models: {}\n")
    with pytest.raises(ReportError, match="'bad name' cannot name a results folder"):
        report_path("my/bad name.yaml", workdir, workflow)


def test_the_report_options_go_before_the_config_files(tmp_path):
    command = report_command(["snakemake", "--cores", "2", "--configfile", "a.yaml"], tmp_path / "r.html")
    assert command[:3] == ["snakemake", "--cores", "2"] and command[-2:] == ["--configfile", "a.yaml"]
    assert command[command.index("--report") + 1] == str(tmp_path / "r.html")
    assert command[command.index("--report-stylesheet") + 1].endswith("report/report.css")
