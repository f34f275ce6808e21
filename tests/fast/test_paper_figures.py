"""The paper's Figs. 1, 3, 4(b), 5, 6: the bars and marks drawn are the metric rows and the paper's numbers."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from verbmirage.analysis.known_object import map_label
from verbmirage.analysis.paper_figures import (
    DRAW,
    Drawn,
    bar_values,
    draw_paper_figures,
    fig1_object_vs_verb,
    fig3_rare_common,
    fig4b_error_consistency,
    fig5_ego_exo,
    fig6_ambiguity,
    drawn_runs,
    figure_note,
    variant_decoding,
)
from verbmirage.evaluation.paper_numbers import (
    load_paper_numbers,
    packaged_paper_numbers,
    paper_names_from_config,
    paper_value,
)

matplotlib.use("Agg")

SHARED_PAPER_NUMBERS = Path(__file__).resolve().parents[3] / "shared" / "data" / "paper_tables.csv"
PAPER = pd.DataFrame(
    [
        ("1", "LLaVA-1.5-7B", "beam5", "yn_obj", "clean", "accuracy", 52.16),
        ("1", "LLaVA-1.5-7B", "beam5", "yn_verb", "clean", "accuracy", 59.16),
        ("2", "LLaVA-1.5-7B", "beam5", "yn_verb", "clean~saltpepper", "error_consistency_kappa_x100", 73.85),
        ("3", "Ensemble(MiniCPM,Qwen-VL-Chat,InstructBLIP)", "beam5", "yn_obj", "clean", "accuracy", 75.59),
        ("4", "LLaVA-1.5-7B", "beam5", "charadesego_yn", "ego", "accuracy", 50.0),
        ("4", "LLaVA-1.5-7B", "beam5", "charadesego_yn", "exo", "accuracy", 60.0),
        ("5", "LLaVA-1.5-7B", "OPERA", "yn_obj", "clean", "accuracy", 42.46),
    ],
    columns=["table", "model", "variant", "qset", "condition", "metric", "value"],
)
NAMES = {"llava": "LLaVA-1.5-7B", "vote": "Ensemble(MiniCPM,Qwen-VL-Chat,InstructBLIP)"}


def _row(model, qset, metric, value, subset="all", condition="clean", dataset="hico", variant="default", ci=0.05):
    return {"dataset": dataset, "qset": qset, "condition": condition, "model": model, "variant": variant,
            "subset": subset, "metric": metric, "value": value, "ci_low": value - ci, "ci_high": value + ci, "n": 10}


def _metrics() -> pd.DataFrame:
    rows = [
        _row("llava", "yn_obj", "accuracy", 0.60), _row("llava", "yn_verb", "accuracy", 0.55),
        _row("llava", "obj_exist", "accuracy", 0.90), _row("llava", "yn_obj", "precision", 0.11),
        _row("llava", "yn_obj", "accuracy", 0.99, variant="vcd"),  # another variant: never drawn
        _row("llava", "yn_obj", "accuracy", 0.01, condition="saltpepper"),  # another condition: never drawn
        _row("vote", "yn_obj", "accuracy", 0.70), _row("vote", "yn_verb", "accuracy", 0.72),
        # vote has no obj_exist row: that bar is left out
        _row("llava", "yn_obj", "accuracy", 0.30, "rare_no"), _row("llava", "yn_obj", "accuracy", 0.80, "non_rare_no"),
        _row("llava", "yn_verb", "accuracy", 0.20, "common_no"),
        _row("llava", "yn_verb", "accuracy", 0.65, "non_common_no"),
        _row("llava", "yn_obj", "accuracy", 0.40, "rare_yes"), _row("llava", "yn_obj", "accuracy", 0.95, "non_rare_yes"),
        _row("llava", "obj_exist", "error_consistency", 0.85, condition="clean_vs_saltpepper"),
        _row("llava", "yn_verb", "error_consistency", -0.10, condition="clean_vs_saltpepper"),
        _row("llava", "yn_obj", "error_consistency", 0.30, condition="clean_vs_crop"),  # another pair
        {**_row("vote", "yn_verb", "error_consistency", 0.5, condition="clean_vs_saltpepper"),
         "ci_low": math.nan, "ci_high": math.nan},  # no interval (bootstrap off): a bar without error bar
        _row("llava", "mc_ego", "circular_accuracy", 0.25, dataset="charadesego"),
        _row("llava", "mc_exo", "circular_accuracy", 0.35, dataset="charadesego"),
        _row("llava", "yn_ego", "accuracy", 0.52, dataset="charadesego"),
        _row("llava", "yn_exo", "accuracy", 0.58, dataset="charadesego"),
        _row("llava", "yn_obj", "accuracy", 0.45, "ambiguous"), _row("llava", "yn_obj", "accuracy", 0.65, "unambiguous"),
        _row("llava", "mc_verb", "circular_accuracy", 0.10, "amb_crowd"),
        _row("llava", "mc_verb", "circular_accuracy", 0.33, "unambiguous"),
    ]
    return pd.DataFrame(rows)


def _values(figure):
    """gid -> height, without the panel title."""
    return {key.split("|", 1)[1]: value for key, value in bar_values(figure).items()}


def _panel(figure, title_start):
    axis = next(a for a in figure.axes if a.get_title().startswith(title_start))
    return {p.get_gid(): p.get_height() for p in axis.patches if p.get_gid()}, {
        line.get_gid(): float(line.get_ydata()[0]) for line in axis.lines if (line.get_gid() or "").startswith("paper|")
    }


def test_fig1_bars_are_the_clean_accuracies_and_the_paper_marks_table1():
    figure = fig1_object_vs_verb(_metrics(), PAPER, models=["llava", "vote"], paper_names=NAMES)
    values = _values(figure)
    assert values["llava|YN w/ object (yn_obj)"] == pytest.approx(60.0)
    assert values["llava|YN verb only (yn_verb)"] == pytest.approx(55.0)
    assert values["llava|object existence (obj_exist, not POPE)"] == pytest.approx(90.0)
    assert values["vote|YN w/ object (yn_obj)"] == pytest.approx(70.0)
    assert "vote|object existence (obj_exist, not POPE)" not in values  # missing row: no bar, no failure ...
    not_asked = [text for text in figure.axes[0].texts if text.get_gid() == "n/a"]  # ... but an n/a in its place
    assert [text.get_text() for text in not_asked] == ["n/a"] and not_asked[0].get_position()[0] > 0.5
    assert values["paper|llava|YN w/ object (yn_obj)"] == 52.16
    assert values["paper|llava|YN verb only (yn_verb)"] == 59.16
    assert values["paper|vote|YN w/ object (yn_obj)"] == 75.59  # Table 3's ensemble
    assert "paper|vote|YN verb only (yn_verb)" not in values  # not in this paper frame
    assert not any("obj_exist" in key and key.startswith("paper|") for key in values)  # POPE is not ours
    # the error bar spans the bootstrap interval
    axis = figure.axes[0]
    segments = [seg for coll in axis.collections for seg in coll.get_segments()]
    assert any(seg[0][1] == pytest.approx(55.0) and seg[1][1] == pytest.approx(65.0) for seg in segments)
    labels = [t.get_text() for t in axis.get_xticklabels()]
    assert labels == ["llava\n(LLaVA-1.5-7B)", "vote\n(Ensemble(MiniCPM,Qwen-VL-Chat,InstructBLIP))"]


def test_fig1_without_paper_numbers_has_no_marks():
    values = _values(fig1_object_vs_verb(_metrics(), None, models=["llava"], paper_names=NAMES))
    assert values and not any(key.startswith("paper|") for key in values)


def test_fig3_answer_no_and_yes_parts():
    figure = fig3_rare_common(_metrics(), PAPER, models=["llava", "vote"], paper_names=NAMES)  # part a
    no, no_marks = _panel(figure, "accuracy per model, correct answer No")
    assert no == pytest.approx({"llava|yn_obj rare HOI": 30.0, "llava|yn_obj non-rare HOI": 80.0,
                                "llava|yn_verb common verb": 20.0, "llava|yn_verb non-common verb": 65.0})
    assert not no_marks  # the paper prints no number for Fig. 3
    assert figure.get_suptitle().startswith("Fig. 3, part a:") and len(figure.axes) == 1
    yes, _ = _panel(fig3_rare_common(_metrics(), PAPER, models=["llava", "vote"], paper_names=NAMES,
                                     part="fig3b"), "accuracy per model, correct answer Yes")
    assert yes == pytest.approx({"llava|yn_obj rare HOI": 40.0, "llava|yn_obj non-rare HOI": 95.0})


def test_fig4b_kappa_x100_for_the_chosen_pair():
    figure = fig4b_error_consistency(_metrics(), PAPER, models=["llava", "vote"], paper_names=NAMES,
                                     pair=("clean", "saltpepper"))
    values = _values(figure)
    assert values["llava|object existence (obj_exist)"] == pytest.approx(85.0)
    assert values["llava|YN verb only (yn_verb)"] == pytest.approx(-10.0)  # negative kappa drawn below 0
    assert "llava|YN w/ object (yn_obj)" not in values  # only under clean_vs_crop
    assert values["vote|YN verb only (yn_verb)"] == pytest.approx(50.0)
    assert values["paper|llava|YN verb only (yn_verb)"] == 73.85
    assert figure.axes[0].get_ylim()[0] < -10
    crop = _values(fig4b_error_consistency(_metrics(), PAPER, models=["llava"], paper_names=NAMES,
                                           pair=("clean", "crop")))
    assert crop == {"llava|YN w/ object (yn_obj)": pytest.approx(30.0)}  # no paper kappa for crops
    # a model that never sees the image agrees with itself under any noise: marked, and said under the title
    marked = fig4b_error_consistency(_metrics(), PAPER, models=["llava", "vote"], paper_names=NAMES,
                                     image_free=["vote", "prior"])
    assert [t.get_text() for t in marked.axes[0].get_xticklabels()][1].endswith("\n(blind)")
    assert "kappa is 100 by construction: vote" in marked.texts[0].get_text() + marked.get_suptitle()


def test_fig5_ego_exo_from_charadesego_with_table4_marks():
    figure = fig5_ego_exo(_metrics(), PAPER, models=["llava"], paper_names=NAMES)
    mc, mc_marks = _panel(figure, "(a)")
    assert mc == pytest.approx({"llava|egocentric": 25.0, "llava|exocentric": 35.0})
    assert not mc_marks
    yn, yn_marks = _panel(figure, "(b)")
    assert yn == pytest.approx({"llava|egocentric": 52.0, "llava|exocentric": 58.0})
    assert yn_marks == {"paper|llava|egocentric": 50.0, "paper|llava|exocentric": 60.0}


def test_fig6_one_row_per_rule_ambiguous_vs_unambiguous_in_three_parts():
    parts = {part: fig6_ambiguity(_metrics(), PAPER, models=["llava"], paper_names=NAMES, part=part)
             for part in ("fig6a", "fig6b", "fig6c")}
    assert [len(figure.axes) for figure in parts.values()] == [2, 4, 4]  # (YN, MC) x (any rule | 2 rules | 2 rules)
    yn_any, _ = _panel(parts["fig6a"], "YN accuracy: any rule")
    assert yn_any == pytest.approx({"llava|yn_obj amb.": 45.0, "llava|yn_obj unamb.": 65.0})
    crowd, _ = _panel(parts["fig6b"], "MC circular accuracy: crowd")
    assert crowd == pytest.approx({"llava|mc_verb amb.": 10.0, "llava|mc_verb unamb.": 33.0})
    size, _ = _panel(parts["fig6b"], "MC circular accuracy: size ratio")
    assert size == pytest.approx({"llava|mc_verb unamb.": 33.0})  # no amb_size row: only the reference bar
    yn_crowd, _ = _panel(parts["fig6b"], "YN accuracy: crowd")
    assert yn_crowd == pytest.approx({"llava|yn_obj unamb.": 65.0})
    assert {axis.get_title().split(": ")[1].split()[0] for axis in parts["fig6c"].axes} == {"occlusion", "invisible"}
    # a run without HICO-DET tags has no such subset: every panel says so instead of failing
    bare = fig6_ambiguity(_metrics()[lambda f: f.subset == "all"], PAPER, models=["llava"], paper_names=NAMES)
    assert not bar_values(bare)
    assert all(any("no questions" in t.get_text() for t in axis.texts) for axis in bare.axes)


def test_draw_writes_every_png(tmp_path):
    assert set(DRAW) == {"fig1", "fig3a", "fig3b", "fig4b", "fig5", "fig6a", "fig6b", "fig6c"}
    paths = {name: tmp_path / f"{name}.png" for name in ("fig1", "fig4b")}  # each figure is drawn above
    notes = draw_paper_figures(_metrics(), paths, PAPER, models=["llava", "vote"], paper_names=NAMES)
    assert set(notes) == set(paths) and all(note.startswith("bars: variant default") for note in notes.values())
    for path in paths.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="unknown paper figures"):
        draw_paper_figures(_metrics(), {"fig2": tmp_path / "x.png"}, PAPER)


def test_figure_note_names_the_decodings_and_random_weights():
    entries = {"tiny_llava": {"path": "resources/models/tiny_llava"}, "prior": {}}
    note = figure_note(entries, {"tiny_llava": "LLaVA-1.5-7B"}, {}, ["tiny_llava", "prior"])
    assert "bars: variant default" in note and "the paper's number (beam5)" in note
    assert "tiny_llava: tiny model(s) with RANDOM weights" in note and "the mark is the real model's number" in note
    assert "prior" not in note
    bare = figure_note(entries, {}, {}, ["tiny_llava", "prior"])
    assert "no paper marks: no model has a paper_name" in bare and "the mark is" not in bare


def test_paper_variant_picks_the_marks_and_the_legend_names_it():
    figure = fig1_object_vs_verb(_metrics(), PAPER, models=["llava"], paper_names=NAMES,
                                 drawn={"llava": Drawn("default", None, "OPERA")})
    values = _values(figure)
    assert values["paper|llava|YN w/ object (yn_obj)"] == 42.46  # Table 5's OPERA row, not beam search
    assert "paper|llava|YN verb only (yn_verb)" not in values
    assert "paper (OPERA)" in [t.get_text() for t in figure.axes[0].get_legend().get_texts()]


def test_the_legend_names_both_decodings_and_says_when_they_differ():
    def legend(decoding):
        figure = fig1_object_vs_verb(_metrics(), PAPER, models=["llava"], paper_names=NAMES,
                                     drawn={"llava": Drawn("default", decoding)})
        found = figure.axes[0].get_legend()
        return found.get_title().get_text(), [t.get_text() for t in found.get_texts()]

    title, entries = legend("greedy")  # a greedy variant beside the paper's beam search
    assert title == "ours: default (greedy)"
    assert "paper (beam5); bars: greedy, not like for like" in entries
    title, entries = legend("beam5")
    assert title == "ours: default (beam5)" and "paper (beam5, as the bars)" in entries
    note = figure_note({}, NAMES, {"llava": Drawn("default", "greedy")}, ["llava"])
    assert "bars: variant default (greedy); diamonds: the paper's number (beam5, not the bars' greedy)" in note


def test_each_model_draws_its_own_variant_and_the_figure_says_which(tmp_path):
    """The run plan gives each model its variant (beam5 where it runs it, else greedy): each group's bars are that
    variant's rows; the legend's title names the variant most models draw, then each other with its models; the
    legend and the note say whose bars are not the marks' decoding."""
    metrics = pd.concat([_metrics().assign(variant=lambda f: f.variant.where(f.model != "llava", "beam5")),
                         pd.DataFrame([_row("llava", "yn_obj", "accuracy", 0.11)])])  # llava's greedy: not drawn
    drawn = drawn_runs({"llava": "beam5", "vote": "default"},
                       {"default": {}, "beam5": {"decoding": "beam", "num_beams": 5, "paper_name": "beam5"}})
    assert drawn == {"llava": Drawn("beam5", "beam5", "beam5"), "vote": Drawn("default", "greedy", "beam5")}
    figure = fig1_object_vs_verb(metrics, PAPER, models=["llava", "vote"], paper_names=NAMES, drawn=drawn)
    values = _values(figure)
    assert values["llava|YN w/ object (yn_obj)"] == pytest.approx(60.0)  # the beam5 row, not the greedy 11
    assert values["vote|YN w/ object (yn_obj)"] == pytest.approx(70.0)
    axis = figure.axes[0]
    legend = axis.get_legend()
    assert " ".join(legend.get_title().get_text().split()) == "ours: beam5; default (greedy): vote"
    assert "paper (beam5); bars of vote greedy: not like for like" in [t.get_text() for t in legend.get_texts()]
    note = figure_note({}, NAMES, drawn, ["llava", "vote"])
    assert note.startswith("bars: variant beam5; default (greedy): vote; diamonds: the paper's number "
                           "(beam5, not the bars' decoding for vote)")
    # Fig. 5: vote has no CharadesEgo row, so it is n/a there, and neither legend nor note speaks of its bars
    fig5 = fig5_ego_exo(metrics, PAPER, models=["llava", "vote"], paper_names=NAMES, drawn=drawn)
    assert all("vote" not in axis.get_legend().get_title().get_text() for axis in fig5.axes if axis.get_legend())
    notes = draw_paper_figures(metrics, {"fig5": tmp_path / "fig5.png"}, PAPER, drawn={"fig5": drawn},
                               models=["llava", "vote"], paper_names=NAMES)
    assert notes["fig5"].startswith("bars: variant beam5;") and "vote" not in notes["fig5"]


def test_variant_decoding_is_the_paper_name_else_the_decoding():
    assert variant_decoding({}) == "greedy"
    assert variant_decoding({"decoding": "beam", "num_beams": 5}) == "beam5"
    assert variant_decoding({"decoding": "beam", "num_beams": 5, "paper_name": "beam5"}) == "beam5"
    assert variant_decoding({"decoding": "beam", "vcd": {}, "paper_name": "VCD"}) == "VCD"
    assert variant_decoding({"decoding": "sample", "vcd": {}}) == "sample+vcd"


def test_paper_names_from_config_as_the_tables_take_them():
    config = {"models": {"minicpm": {"paper_name": "MiniCPM-Llama3-V2.5"}, "qwen": {"paper_name": "Qwen-VL-Chat"},
                         "blip": {"paper_name": "InstructBLIP-7B"}, "tiny_llava": {"backend": "llava"}},
              "ensembles": {"vote3": ["minicpm", "qwen", "blip"], "other": ["qwen", "tiny_llava"]}}
    names = paper_names_from_config(config)
    assert names == {"minicpm": "MiniCPM-Llama3-V2.5", "qwen": "Qwen-VL-Chat", "blip": "InstructBLIP-7B",
                     "vote3": "Ensemble(MiniCPM,Qwen-VL-Chat,InstructBLIP)"}  # no name by backend


def test_a_paper_method_model_is_not_the_papers_model_in_any_figure_or_table():
    """One rule pairs our rows with the paper's everywhere: an entry with paper_method (a fine-tuned adapter
    that names its base's paper_name so that Table 5 compares it) gets no mark in the figures, no Table 1-4/8
    row and no Fig. 11 mAP of the plain model; Table 5's method rows pair it by its base."""
    config = {"models": {
        "llava": {"backend": "llava", "paper_name": "LLaVA-1.5-7B"},
        "reverie": {"backend": "llava", "adapter": "a/lora", "paper_name": "LLaVA-1.5-7B", "paper_method": "REVERIE"},
        "nullu": {"derive": {"method": "nullu", "base": "llava"}, "paper_method": "Nullu"},
        "own": {"derive": {"method": "nullu", "base": "llava"}}}}  # derived, no paper_method, no paper_name
    names = paper_names_from_config(config)
    assert names == {"llava": "LLaVA-1.5-7B"}
    assert paper_names_from_config(config, method_rows=True) == {"llava": "LLaVA-1.5-7B", "reverie": "LLaVA-1.5-7B",
                                                                  "nullu": "LLaVA-1.5-7B"}
    metrics = pd.concat([_metrics(), _metrics().assign(model=lambda f: f.model.replace({"llava": "reverie"}))])
    values = _values(fig1_object_vs_verb(metrics, PAPER, models=["llava", "reverie"], paper_names=names))
    assert "paper|llava|YN w/ object (yn_obj)" in values
    assert not any(key.startswith("paper|reverie|") for key in values)
    assert map_label("reverie", 0.5, names.get("reverie", "")) == "reverie 50.00"


def test_paper_value_takes_the_default_decoding():
    assert paper_value(PAPER, "LLaVA-1.5-7B", "yn_obj", "clean", "accuracy") == 52.16  # beam5, not OPERA
    assert paper_value(PAPER, "LLaVA-1.5-7B", "yn_obj", "clean", "accuracy", variant="OPERA") == 42.46
    assert math.isnan(paper_value(PAPER, "LLaVA-1.5-7B", "mc_obj", "clean", "circular_accuracy"))
    assert math.isnan(paper_value(PAPER, None, "yn_obj", "clean", "accuracy"))


def test_load_paper_numbers_absent_and_malformed(tmp_path):
    assert load_paper_numbers(tmp_path / "absent.csv").empty
    assert load_paper_numbers("").empty
    bad = tmp_path / "bad.csv"
    bad.write_text("table,model,variant,qset,condition,metric,value,note\n1,M,beam5,yn_obj,clean,accuracy,52.1,\n"
                   "1,M,beam5,yn_verb,clean,accuracy,n/a,\n")
    with pytest.raises(ValueError, match=r"bad.csv: row 3 has a non-numeric value 'n/a'"):
        load_paper_numbers(bad)
    (tmp_path / "cols.csv").write_text("model,value\nM,1\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_paper_numbers(tmp_path / "cols.csv")


def test_packaged_paper_numbers_mark_table1_and_table2():
    paper = load_paper_numbers(packaged_paper_numbers())
    assert paper_value(paper, "LLaVA-1.5-7B", "yn_verb", "clean", "accuracy") == 59.16
    assert paper_value(paper, "InstructBLIP-7B", "yn_verb", "clean", "accuracy") == 73.82  # Table 1, not Table 3
    assert paper_value(paper, "Qwen-VL-Chat", "yn_verb", "clean~saltpepper", "error_consistency_kappa_x100") == 38.47
    assert paper_value(paper, "Qwen2-VL-7B", "charadesego_yn", "exo", "accuracy") == 63.01
    values = _values(fig4b_error_consistency(_metrics(), paper, models=["llava"], paper_names=NAMES))
    assert values["paper|llava|YN verb only (yn_verb)"] == 73.85
    if SHARED_PAPER_NUMBERS.is_file():  # the package's copy is the shared file
        pd.testing.assert_frame_equal(paper, load_paper_numbers(SHARED_PAPER_NUMBERS))


def test_a_name_over_its_paper_name_gets_room_from_its_neighbours():
    """Nine models, one with a paper name under its slug (the demo with paper_name set): the two-line name ran
    into its neighbour at 30 degrees, so the names turn further than single-line ones need."""
    models = ["always_yes", "random", "prior", "oracle", "tiny_llava", "tiny_llava_nullu", "tiny_llava_pangea",
              "tiny_clip", "blind_vote"]
    metrics = pd.DataFrame([_row(model, "yn_obj", "accuracy", 0.5) for model in models])
    plain = fig1_object_vs_verb(metrics, None, models=models)
    named = fig1_object_vs_verb(metrics, None, models=models, paper_names={"tiny_llava": "LLaVA-1.5-7B"})
    turned = [figure.axes[0].get_xticklabels()[0].get_rotation() for figure in (plain, named)]
    assert turned[0] == 30 and turned[1] > turned[0]
