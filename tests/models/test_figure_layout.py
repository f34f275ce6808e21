"""Every figure the workflow draws fits a page and is saved for a paper (verbmirage.analysis.figure_layout).

Each figure is drawn from small frames of the real table schemas, twice: at most 1,800 px wide, at most 1.3
times as tall as wide, at most three panels a row, no font under 8 pt, a PDF and an SVG beside the PNG, and the
same PNG both times (a killed and
rerun demo must give a byte-identical tree, docs/faults.md; that the PDF and SVG writers add no date or random
id is checked once, on Fig. 3).
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.figure
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from test_attention import attention_table
from test_uncertainty import NO_BOOTSTRAP, fov_fixture, mc_questions, predictions, yn_questions
from test_vcd_divergence import _runs as vcd_runs

from verbmirage.analysis import figure_layout as layout
from verbmirage.analysis.attention_figures import draw_attention_figures
from verbmirage.analysis.attention_settings import figure_models
from verbmirage.analysis.fov import fov_tables
from verbmirage.analysis.known_object import draw_known_object_figure
from verbmirage.analysis.object_reliance import OBJECTS_PER_PANEL, draw_fig15
from verbmirage.analysis.paper_figures import AMBIGUITY_RULES, DRAW, Drawn, draw_paper_figures
from verbmirage.analysis.uncertainty import uncertainty_tables
from verbmirage.analysis.uncertainty_settings import UncertaintySettings
from verbmirage.analysis.uncertainty_figures import draw_fov_figure, draw_uncertainty_figures
from verbmirage.analysis.fov_settings import fov_pages
from verbmirage.analysis.vcd_divergence import draw_vcd_divergence_figure, vcd_divergence_tables
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers

# long names, as a real config has them: the tick labels must still fit
MODELS = ["llava15_7b_hico_pangea", "instructblip_7b", "qwen_vl_chat", "blind_vote_ensemble"]
PAPER_NAMES = {"llava15_7b_hico_pangea": "LLaVA-1.5-7B"}
# two models' bars beam 5, two greedy: every tick then names its model's decoding, the longest labels
DRAWN = {m: Drawn("beam5", "beam5") if i < 2 else Drawn("default", "greedy") for i, m in enumerate(MODELS)}


def _paper_metrics() -> pd.DataFrame:
    """Every quantity Figs. 1, 3, 4(b), 5, 6 draw, for each model; n=12 on some, so they must say so."""
    keys = [("hico", q, "clean", "all", "accuracy") for q in ("yn_obj", "yn_verb", "obj_exist")]
    keys += [("hico", q, "clean", f"{s}_{a}", "accuracy") for a in ("no", "yes")
             for q, subsets in (("yn_obj", ("rare", "non_rare")), ("yn_verb", ("common", "non_common")))
             for s in subsets]
    keys += [("hico", q, "clean_vs_saltpepper", "all", "error_consistency") for q in ("yn_obj", "yn_verb", "obj_exist")]
    keys += [("charadesego", f"{kind}_{view}", "clean", "all", metric) for view in ("ego", "exo")
             for kind, metric in (("mc", "circular_accuracy"), ("yn", "accuracy"))]
    keys += [("hico", q, "clean", s, metric) for s in ("ambiguous", *AMBIGUITY_RULES, "unambiguous")
             for q, metric in (("yn_obj", "accuracy"), ("yn_verb", "accuracy"), ("mc_obj", "circular_accuracy"),
                               ("mc_verb", "circular_accuracy"))]
    rng = np.random.default_rng(0)
    rows = [{"dataset": d, "qset": q, "condition": c, "model": m, "variant": "default", "subset": s, "metric": metric,
             "value": v, "ci_low": v - 0.05, "ci_high": v + 0.05, "n": 12 if s.startswith("amb_") else 400}
            for m in MODELS for (d, q, c, s, metric), v in zip(keys, rng.uniform(0.2, 0.9, len(keys)))]
    return pd.DataFrame(rows).assign(variant=lambda f: f.model.map(lambda m: DRAWN[m].variant))


def _paper_figures(folder: Path) -> None:
    entries = {m: {"path": f"resources/models/tiny_{m}"} for m in MODELS}
    draw_paper_figures(_paper_metrics(), {name: folder / f"{name}.png" for name in DRAW},
                       load_paper_numbers(packaged_paper_numbers()), models=MODELS, paper_names=PAPER_NAMES,
                       drawn={name: DRAWN for name in DRAW}, model_entries=entries)


def _attention_figures(folder: Path) -> None:
    table = attention_table(np.random.default_rng(0))
    paths = {n: folder / f"fig{n}_attention.png" for n in (7, 8, 13, 14)}
    draw_attention_figures(table, paths, figure_models(["llava"], {"llava": "llava"}),
                           {"llava": "tiny model with RANDOM weights"}, backends={"llava": "llava"})


def _uncertainty_figures(folder: Path) -> None:
    obj = yn_questions("yn_obj", ["yes", "no", "no", "yes"])
    mc = mc_questions("mc_obj", {"g": ("img0", ["A", "B"])})
    keys = {"variant": "default", "condition": "clean", "model": "llava15_7b"}
    runs = [({**keys, "qset": "yn_obj"}, obj, predictions(obj.question_id, ["yes", "yes", "no", "maybe"],
                                                          [0.9, 0.6, 0.7, 0.5])),
            ({**keys, "qset": "mc_obj"}, mc, predictions(mc.question_id, ["A", "A"], [0.8, 0.4]))]
    hist, _ = uncertainty_tables(runs, UncertaintySettings(), NO_BOOTSTRAP)
    draw_uncertainty_figures(hist, {n: folder / f"fig{n}_uncertainty.png" for n in (9, 12)}, ["llava15_7b"],
                             {"llava15_7b": "llava"}, notes={"llava15_7b": "tiny model"}, skipped=["prior"])


def _fov_figure(folder: Path) -> None:
    image_tags, questions, answered = fov_fixture()
    conditions = {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.0}}
    runs = [({"model": model, "variant": "default", "qset": qset}, questions.assign(qset=qset), answered)
            for model in ("llava15_7b", "instructblip_7b") for qset in ("mc_verb", "mc_obj", "mc_ego", "mc_exo")]
    models, qsets = ["llava15_7b", "instructblip_7b"], ["mc_verb", "mc_obj", "mc_ego", "mc_exo"]
    fov, rows = fov_tables(runs, image_tags, conditions, NO_BOOTSTRAP, models)
    paths = [folder / f"{name}.png" for name in layout.part_names("fig10_fov", len(fov_pages(models, len(qsets))))]
    assert len(paths) == 2  # four sets a model (two rows of two): a page each
    draw_fov_figure(fov, rows, paths, models, qsets, skipped=["prior"])


def _known_object_figure(folder: Path) -> None:
    rng = np.random.default_rng(0)
    ap = pd.DataFrame([{"dataset": "hico", "condition": "clean", "model": model, "variant": "default", "hoi_id": hoi,
                        "verb": "ride", "object": "horse", "rare": False, "n_pos": 3, "n": 20, "ap": value,
                        "ap_voc11": value, "n_tied_scores": 0}
                       for model in ("llava15_7b", "clip_l14", "qwen_vl_chat")
                       for hoi, value in enumerate(rng.uniform(0, 1, 120))])
    metrics = pd.DataFrame([{"dataset": "hico", "qset": "yn_ko", "condition": "clean", "model": m, "variant": "default",
                             "subset": "all", "metric": "map_voc11", "value": 0.4, "ci_low": 0.3, "ci_high": 0.5,
                             "n": 120} for m in ("llava15_7b", "clip_l14", "qwen_vl_chat")])
    draw_known_object_figure(ap, metrics, "clip_l14", folder / "fig11_known_object_ap.png",
                             paper_names=PAPER_NAMES, notes={"llava15_7b": "tiny model with RANDOM weights"})


def _vcd_figure(folder: Path) -> None:
    summary, hist = vcd_divergence_tables(vcd_runs(), bins=4)
    draw_vcd_divergence_figure(summary, hist, folder / "vcd_divergence.png", {"tiny_llava": "tiny model"})


def _reliance_figure(folder: Path) -> None:
    count = OBJECTS_PER_PANEL + 10  # more objects than one panel holds
    objects = pd.DataFrame({"model": "m", "object": [f"dining_table_{i}" for i in range(count)], "qset_pair": "yn",
                            "n_obj": [12 if i % 3 else 40 for i in range(count)], "n_verb": 40, "acc_obj": 0.5,
                            "acc_verb": 0.5, "delta": np.linspace(0.3, -0.3, count), "in_set": False})
    draw_fig15(objects, "m", folder / "fig15_object_reliance.png", overall={"yn_obj": 61.0, "yn_verb": 60.0},
               note="tiny model with RANDOM weights")


DRAWINGS = {
    "paper figures (1, 3a, 3b, 4b, 5, 6a-6c)": _paper_figures,
    "attention (7, 8, 13, 14)": _attention_figures,
    "uncertainty (9, 12)": _uncertainty_figures,
    "field of view (10)": _fov_figure,
    "Known-Object (11)": _known_object_figure,
    "VCD divergence": _vcd_figure,
    "object reliance (15)": _reliance_figure,
}


@pytest.fixture
def saved(monkeypatch) -> list:
    """(figure, path) of every Figure.savefig call while the test runs; ``path`` is the file it becomes (a figure
    is saved to a temporary file beside it, ``.<name>.<random>.tmp``, then renamed)."""
    calls, original = [], matplotlib.figure.Figure.savefig

    def savefig(figure, path, *args, **kwargs):
        temporary = re.fullmatch(r"\.(.+)\.[^.]+\.tmp", Path(path).name)
        calls.append((figure, Path(path).with_name(temporary.group(1)) if temporary else Path(path)))
        return original(figure, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return calls


@pytest.mark.slow  # about a minute: fifteen figures in three formats, then again as PNG
@pytest.mark.parametrize("name", list(DRAWINGS))
def test_every_figure_fits_a_page_and_saves_the_same_bytes_twice(name, tmp_path, saved, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    DRAWINGS[name](first)
    pngs = sorted(first.glob("*.png"))
    assert pngs
    assert {path.name for _, path in saved} == {p.name for png in pngs for p in [png, *layout.companion_paths(png)]}
    with monkeypatch.context() as again:  # the second drawing as PNG only: what the figure shows must not change
        again.setattr(layout, "companion_paths", lambda path: [])
        DRAWINGS[name](second)
    for png in pngs:
        with Image.open(png) as image:
            assert image.size[0] <= layout.MAX_WIDTH_PX, (png.name, image.size)
            assert image.size[1] <= layout.MAX_HEIGHT_RATIO * image.size[0], (png.name, image.size)
        assert png.read_bytes() == (second / png.name).read_bytes(), f"{png.name} differs between drawings"
        for path in layout.companion_paths(png):  # the PDF and SVG beside it
            assert path.stat().st_size > 1000, path.name
    for figure, path in saved:
        assert not layout.layout_problems(figure), (path.name, layout.layout_problems(figure))
        assert max(layout.panels_per_row(figure)) <= 3 and layout.smallest_font(figure) >= 8


@pytest.mark.parametrize("name", list(DRAW))
def test_paper_figures_fit_a_page(name):
    metrics, paper = _paper_metrics(), load_paper_numbers(packaged_paper_numbers())
    figure = DRAW[name](metrics, paper, models=MODELS, paper_names=PAPER_NAMES, note="a note\nanother line",
                        drawn=DRAWN)
    figure.draw_without_rendering()  # places the panels as a save does
    assert not layout.layout_problems(figure)
    if name.startswith("fig6"):  # was ten panels in one row, 4,840 px wide, then five rows, 1.8 times as tall
        assert layout.panels_per_row(figure) == [2] * (1 if name == "fig6a" else 2)  # YN | MC, a row per rule


def test_small_samples_say_n_and_large_ones_do_not():
    figure = DRAW["fig6b"](_paper_metrics(), None, models=MODELS, drawn=DRAWN)
    titles = [axis.get_title() for axis in figure.axes]
    assert all("n=12" in title for title in titles if "crowd" in title)  # the amb_* subsets have 12 questions
    assert not any("n=" in title for title in titles if "any rule" in title)  # 400: nothing said


def test_save_figure_writes_png_pdf_svg_with_the_same_bytes_each_time(tmp_path):
    for folder in ("a", "b"):
        figure = DRAW["fig3a"](_paper_metrics(), None, models=MODELS[:2])  # hatches, error bars, legends, text
        paths = layout.save_figure(figure, tmp_path / folder / "fig3.png")
        assert [p.suffix for p in paths] == [".png", ".pdf", ".svg"]
    for suffix in (".png", ".pdf", ".svg"):
        assert (tmp_path / "a" / f"fig3{suffix}").read_bytes() == (tmp_path / "b" / f"fig3{suffix}").read_bytes()
    assert b"CreationDate" not in (tmp_path / "a" / "fig3.pdf").read_bytes()
    assert b"<dc:date>" not in (tmp_path / "a" / "fig3.svg").read_bytes()
    with Image.open(tmp_path / "a" / "fig3.png") as image:
        assert image.size[0] == layout.PAGE_WIDTH * layout.DPI == 1750


# ---- the helper on its own ---------------------------------------------------------------------------------
def test_no_figure_is_taller_than_a_page():
    """Rows beyond a page lower the panels (not below MIN_PANEL_HEIGHT); a figure planned in parts names each."""
    with layout.page_style():
        tall, _ = layout.page_figure(8, columns=2, panel_height=2.3, heading="a heading\nand a note")
        short, _ = layout.page_figure(2, columns=1, panel_height=2.3, heading="a heading")
        crowded, _ = layout.page_figure(30, columns=1, panel_height=2.3)
    assert tall.get_size_inches()[1] == pytest.approx(layout.MAX_HEIGHT)  # 4 rows x 2.3 in: lowered to fit
    assert not layout.layout_problems(tall)
    assert short.get_size_inches()[1] == pytest.approx(2 * 2.3 + layout.heading_height(1))  # fits: as asked
    assert crowded.get_size_inches()[1] == pytest.approx(30 * layout.MIN_PANEL_HEIGHT + layout.heading_height(0))
    assert "times as tall as wide (at most 1.3)" in layout.layout_problems(crowded)[0]
    assert layout.rows_per_page(3.0) == 2 and layout.rows_per_page(2.3) == 3 and layout.rows_per_page(20) == 1
    assert layout.part_names("fig10_fov", 3) == ["fig10a_fov", "fig10b_fov", "fig10c_fov"]
    with pytest.raises(ValueError, match="27 parts"):
        layout.part_names("fig10_fov", 27)


def test_fig10_shows_as_many_models_a_page_as_fit():
    models = [f"m{i}" for i in range(5)]
    assert fov_pages(models, 2) == [["m0", "m1"], ["m2", "m3"], ["m4"]]  # a row a model, two rows a page
    assert fov_pages(models[:2], 4) == [["m0"], ["m1"]]  # four sets: two rows of two a model
    assert fov_pages([], 2) == [[]]  # no logit-scored model: one page says so
    with pytest.raises(ValueError, match="takes 3 pages, 1 files given"):
        draw_fov_figure(pd.DataFrame(), pd.DataFrame(), ["fig10a_fov.png"], models, ["mc_obj", "mc_verb"])


def test_grid_never_puts_more_than_three_panels_in_a_row():
    assert layout.grid(10) == (4, 3)
    assert layout.grid(10, columns=2) == (5, 2)
    assert layout.grid(2) == (1, 2)
    assert layout.grid(5, columns=7) == (2, 3)
    assert layout.grid(0) == (1, 1)


def test_columns_for_leaves_each_group_its_room():
    assert layout.columns_for(3, groups=2) == 3
    assert layout.columns_for(2, groups=8) == 1  # eight bar groups need the page's width
    assert layout.columns_for(1, groups=1) == 1


def test_n_label_only_where_the_sample_is_small():
    assert layout.n_label(12) == "n=12"
    assert layout.n_label(29) == "n=29"
    assert layout.n_label(30) == ""
    assert layout.n_label(None) == "" and layout.n_label(float("nan")) == ""


def test_companions_of_a_png_only(tmp_path):
    assert layout.companion_paths(tmp_path / "fig1.png") == [tmp_path / "fig1.pdf", tmp_path / "fig1.svg"]
    with pytest.raises(ValueError, match=r"fig1\.jpg: a figure is named by its PNG"):
        layout.companion_paths(tmp_path / "fig1.jpg")


def test_layout_problems_name_a_wide_figure_a_full_row_and_a_small_font():
    from matplotlib.figure import Figure

    figure = Figure(figsize=(20, 3))
    axes = figure.subplots(1, 4)
    axes[0].set_title("tiny", fontsize=6)
    problems = layout.layout_problems(figure)
    assert any("5000 px wide" in p for p in problems)
    assert any("4 panels in a row" in p for p in problems)
    assert any("6 pt font" in p and "tiny" in p for p in problems)
    with layout.page_style():
        page, _ = layout.page_figure(4, heading="a heading")
    assert layout.panels_per_row(page) == [3, 1] and not layout.layout_problems(page)


def test_saving_keeps_the_job_log_free_of_font_subsetting_chatter(tmp_path, caplog):
    with caplog.at_level("INFO"):
        layout.save_figure(DRAW["fig1"](_paper_metrics(), None, models=MODELS[:1]), tmp_path / "fig1.png")
    assert not [record for record in caplog.records if record.name.startswith("fontTools")]
    assert (tmp_path / "fig1.pdf").is_file()
