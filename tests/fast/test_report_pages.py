"""The HTML report's structure (verbmirage.workflow.report_items) and its own pages (verbmirage.workflow.report_pages),
without Snakemake."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from verbmirage.evaluation.tables import STAND_IN, stand_in_note
from verbmirage.workflow import report_pages
from verbmirage.workflow.report_items import FIGURES, REPORT_ITEMS, TABLES, report_item, report_options
from verbmirage.workflow.report_pages import landing_frame, landing_html, run_facts_html

REPO = Path(__file__).resolve().parents[2]


def test_each_report_item_has_its_caption_and_a_unique_place():
    for end, item in REPORT_ITEMS.items():
        assert (REPO / "report" / item.caption).is_file(), (end, item.caption)
    places = [(item.category, item.labels["no."]) for item in REPORT_ITEMS.values()]
    assert len(places) == len(set(places)), "two items share a place in one category"


def test_figures_sort_in_the_papers_order_and_their_captions_open_with_its_finding():
    figures = sorted((item for item in REPORT_ITEMS.values() if item.category == FIGURES),
                     key=lambda item: item.labels["no."])  # the report sorts by the first label, as text
    numbers = [int(re.match(r"Fig\. (\d+)", item.paper).group(1)) for item in figures]
    assert numbers == sorted(numbers) == [1, 3, 3, 4, 5, 6, 6, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]  # 3, 6 in parts
    assert [item.labels["no."] for item in figures][1:3] == ["03a", "03b"]
    for item in figures:
        assert (REPO / "report" / item.caption).read_text().startswith("**The paper found:** "), item.caption
    tables = sorted((item for item in REPORT_ITEMS.values() if item.category == TABLES),
                    key=lambda item: item.labels["no."])
    assert [item.paper for item in tables][:8] == [f"Table {n}" for n in range(1, 9)]


def test_report_options_for_a_file_a_pattern_and_an_unknown_file():
    options = report_options("results/paper/figures/fig10b_fov.png")  # another config's results folder
    assert options == {"category": FIGURES, "caption": "../report/fov_fig10.rst",  # Fig. 10's second page
                       "labels": {"no.": "10b", "paper": "Fig. 10", "shows": "field of view and uncertainty"}}
    assert report_item("results/figures/fig6c_ambiguity.png").labels["no."] == "06c"
    counts = report_options("results/benchmark/{dataset}/counts.html")
    assert counts["category"] == TABLES and counts["caption"] == "../report/counts.rst"
    assert counts["labels"]({"dataset": "charadesego"})["shows"] == "CharadesEgo question counts"
    assert counts["labels"]({"dataset": "hico"})["no."] == "09"
    with pytest.raises(KeyError, match="fig99.png is marked for the report but has no entry"):
        report_item("results/figures/fig99.png")
    with pytest.raises(KeyError, match="matches no entry"):
        report_options("results/{dataset}/nothing.html")


def test_rule_files_mark_results_through_the_list():
    """Rule files mark results with ``reported(path)`` (its place from REPORT_ITEMS), never with a bare
    ``report(...)`` (tests/fast/test_plan.py checks that every planned report file has an item)."""
    for rule_file in (REPO / "rules").glob("*.smk"):
        if rule_file.name != "common.smk":
            assert not re.search(r"(?<![\w.])report\(", rule_file.read_text()), f"{rule_file.name} calls report()"


def _table1() -> pd.DataFrame:
    rows = [
        {"source": "measured", "model": "llava", "variant": "default", "paper_name": "LLaVA-1.5-7B",
         "yn_obj_acc": 50.0, "yn_verb_acc": 60.0, "mc_obj_acc": 40.0, "mc_verb_acc": math.nan, "note": math.nan},
        {"source": "measured", "model": "llava", "variant": "beam5", "paper_name": "LLaVA-1.5-7B",
         "yn_obj_acc": 55.0, "yn_verb_acc": 61.0, "mc_obj_acc": 45.0, "mc_verb_acc": 30.0, "note": math.nan},
        {"source": "measured", "model": "tiny", "variant": "default", "paper_name": "",
         "yn_obj_acc": 33.0, "yn_verb_acc": 34.0, "mc_obj_acc": 0.0, "mc_verb_acc": 0.0,
         "note": stand_in_note("random weights")},
        {"source": "paper", "model": "LLaVA-1.5-7B", "variant": "beam5", "paper_name": "LLaVA-1.5-7B",
         "yn_obj_acc": 52.16, "yn_verb_acc": 59.16, "mc_obj_acc": 57.37, "mc_verb_acc": 51.0, "note": math.nan},
        {"source": "paper", "model": "InstructBLIP-7B", "variant": "beam5", "paper_name": "InstructBLIP-7B",
         "yn_obj_acc": 72.53, "yn_verb_acc": 73.82, "mc_obj_acc": 13.48, "mc_verb_acc": 6.25, "note": math.nan},
    ]
    return pd.DataFrame(rows)


def test_landing_puts_the_papers_row_and_the_difference_under_the_matching_model():
    frame = landing_frame(_table1(), {"default": "", "beam5": "beam5"})
    assert list(frame.source) == ["ours", "paper", "Δ (ours − paper)", "ours", "paper"]
    assert list(frame.model) == ["llava", "LLaVA-1.5-7B", "llava", "tiny †", "InstructBLIP-7B"]
    assert frame.variant.iloc[0] == "beam5"  # the variant with the paper's decoding, not the first
    assert frame["YN w/ obj"].iloc[2] == "+2.84" and frame["MC verb only"].iloc[2] == "-21.00"
    without_decoding = landing_frame(_table1(), {})  # no variant names the paper's: no row beside ours
    assert list(without_decoding.source) == ["ours", "ours", "paper", "paper"]
    assert without_decoding.variant.iloc[0] == "default"


def test_landing_html_notes_the_stand_ins_and_says_when_there_is_no_table1():
    text = landing_html(_table1(), {}, {"tiny": "random weights", "absent": "an oracle"})
    assert "<table class='vm-headline'>" in text and "Table 1 at a glance" in text
    assert f"† {STAND_IN} (tiny: random weights)" in text and "absent" not in text
    assert "align-items: flex-start" in text  # the landing starts at the top of the screen
    assert "made no Table 1" in landing_html(None)


def test_the_landing_names_the_data_and_models_as_text():
    config = {"datasets": {"hico": {"root": "data/<svg onload=alert(4)>/hico"}}, "models": {"prior": {}}}
    text = landing_html(None, config=config)
    assert "<p>Data: hico from <code>data/&lt;svg onload=alert(4)&gt;/hico</code>; models: prior.</p>" in text
    assert "<svg" not in text


def test_run_facts_name_the_commit_versions_roots_models_and_config(tmp_path):
    repository = tmp_path / "pipeline"
    repository.mkdir()
    for command in (["init", "-q"], ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty",
                                     "-m", "x"]):
        subprocess.run(["git", "-C", str(repository), *command], check=True)
    commit = subprocess.run(["git", "-C", str(repository), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    (tmp_path / "hico").mkdir()
    config = {"datasets": {"hico": {"root": "hico"}, "charadesego": {"root": "gone"}},
              "models": {"llava": {"backend": "llava", "path": "weights/llava", "paper_name": "LLaVA-1.5-7B"},
                         "nullu": {"derive": {"method": "nullu", "base": "llava"}}},
              "metrics": {"bootstrap_resamples": 1000}}
    page = run_facts_html(config, repository, workdir=tmp_path, stand_ins={"nullu": "random weights"})
    assert commit in page and "local changes" not in page
    assert re.search(r"<th>torch</th><td>[\w.+]+</td>", page) and "<th>python</th>" in page
    assert f"hico -&gt; {tmp_path / 'hico'}</td>" in page and "(missing)" in page  # charadesego's root is gone
    assert "backend llava, weights/llava; the paper&#x27;s LLaVA-1.5-7B" in page
    assert f"nullu of llava; {STAND_IN} (random weights)".replace("'", "&#x27;") in page
    shown = re.search(r"<pre>(.*)</pre>", page, re.S).group(1)
    assert yaml.safe_load(shown.replace("&#x27;", "'").replace("&gt;", ">"))["metrics"] == {"bootstrap_resamples": 1000}
    assert "not a git checkout" in report_pages.pipeline_commit(tmp_path / "hico")
