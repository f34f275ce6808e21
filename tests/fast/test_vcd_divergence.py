"""VCD divergence: pairing of VCD and plain variants, KL shares, flips, tables, figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import confusion_matrix

from verbmirage.analysis.vcd_divergence import (
    PAPER,
    divergence_report_table,
    draw_vcd_divergence_figure,
    flip_statistics,
    histogram_rows,
    kl_bin_edges,
    kl_rows,
    kl_statistics,
    overall_rows,
    vcd_divergence_tables,
)
from verbmirage.analysis.vcd_divergence_settings import (
    VCDDivergenceSettings,
    divergence_runs,
    plain_counterparts,
    vcd_divergence_settings,
    vcd_variants,
)
from verbmirage.core.errors import ConfigError
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import VCD_DIVERGENCE, VCD_KL_HIST

PAPER_TEXT = Path(__file__).resolve().parents[3] / "shared" / "paper" / "verb_mirage.txt"


def config(variants: dict, analysis: dict | None = None) -> dict:
    return {
        "variants": variants,
        "conditions": {"clean": {"type": "clean"}, "saltpepper": {"type": "saltpepper"}},
        "questions": {"sets": ["yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist"]},
        "analysis": {"vcd_divergence": analysis} if analysis is not None else {},
    }


def predictions(ids, answers, kl=None, plausible=None, errors=None) -> pd.DataFrame:
    n = len(ids)
    return pd.DataFrame({
        "question_id": ids, "prediction": answers, "error": errors or [None] * n,
        "vcd_kl": kl if kl is not None else [None] * n,
        "vcd_plausible": plausible if plausible is not None else [None] * n,
    })


def questions(qset: str, answers: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"qset": qset, "question_id": [f"{qset}-{i}" for i in range(len(answers))],
                         "answer": answers})


# ---- pairing VCD variants with their plain counterparts -----------------------------------------------------


def test_the_plain_counterpart_is_the_variant_with_the_same_settings_without_vcd():
    cfg = config({
        "default": {},
        "beam": {"decoding": "beam", "paper_name": "beam5"},
        "vcd": {"vcd": {}},
        "beam_vcd": {"decoding": "beam", "num_beams": 5, "vcd": {"alpha": 0.5}, "paper_name": "VCD"},
        "sample_vcd": {"decoding": "sample", "vcd": {}},  # no plain sampling variant configured
        "suffix": {"prompt_suffix": " Answer with one word."},
    })
    assert vcd_variants(cfg) == ["vcd", "beam_vcd", "sample_vcd"]
    # paper_name is a label: it neither blocks nor makes a pair; num_beams 5 is beam's default
    assert plain_counterparts(cfg) == {"vcd": "default", "beam_vcd": "beam", "sample_vcd": None}


def test_pairs_in_config_override_the_automatic_counterpart_and_are_checked():
    variants = {"default": {}, "sample": {"decoding": "sample"}, "vcd": {"vcd": {}}}
    settings = vcd_divergence_settings(config(variants, {"pairs": {"vcd": "sample"}}))
    assert plain_counterparts(config(variants), settings.pairs) == {"vcd": "sample"}
    with pytest.raises(ConfigError, match=r"analysis.vcd_divergence.pairs: 'default' is not a VCD variant"):
        vcd_divergence_settings(config(variants, {"pairs": {"default": "sample"}}))
    with pytest.raises(ConfigError, match=r"analysis.vcd_divergence.pairs.vcd: 'nope' is not a configured variant"):
        vcd_divergence_settings(config(variants, {"pairs": {"vcd": "nope"}}))
    with pytest.raises(ConfigError, match=r"pairs.vcd: 'vcd' is not a configured variant without vcd"):
        vcd_divergence_settings(config(variants, {"pairs": {"vcd": "vcd"}}))


def test_settings_defaults_and_checked_keys():
    settings = vcd_divergence_settings(config({"default": {}}))  # block absent: the defaults
    assert settings == VCDDivergenceSettings()
    assert settings.qsets == ("yn_obj", "yn_verb", "mc_obj", "mc_verb") and settings.conditions == ("clean",)
    with pytest.raises(ConfigError, match=r"analysis.vcd_divergence.conditions: \['crop'\]"):
        vcd_divergence_settings(config({"default": {}}, {"conditions": ["crop"]}))
    no_clean = config({"default": {}})
    no_clean["conditions"] = {"noisy": {"type": "saltpepper"}}
    assert vcd_divergence_settings(no_clean).conditions == ("noisy",)  # the analysis runs without its block
    with pytest.raises(ConfigError, match=r"analysis.vcd_divergence.bins"):
        vcd_divergence_settings(config({"default": {}}, {"bins": 0}))


def test_runs_cover_models_running_a_vcd_variant_and_say_why_flips_are_missing():
    cfg = config({"default": {}, "sample": {"decoding": "sample"}, "vcd": {"vcd": {}},
                  "sample_vcd": {"decoding": "sample", "top_p": 0.9, "vcd": {"beta": 0.2}}})
    cfg["models"] = {"llava": {}, "qwen": {"variant_settings": {"vcd": {"vcd": {"beta": 0.3}}}}, "prior": {}}
    settings = vcd_divergence_settings(cfg)
    model_variants = {"llava": ["default", "vcd", "sample_vcd"], "qwen": ["vcd"], "prior": ["default"]}
    asked = {("clean", "yn_obj"), ("clean", "mc_verb"), ("saltpepper", "yn_obj")}
    runs = divergence_runs(cfg, model_variants, lambda c, q, m: (c, q) in asked and not (m == "qwen" and q == "mc_verb"),
                           settings)
    keys = [(r["model"], r["variant"], r["qset"], r["plain_variant"]) for r in runs]
    assert keys == [("llava", "vcd", "yn_obj", "default"), ("llava", "vcd", "mc_verb", "default"),
                    ("llava", "sample_vcd", "yn_obj", None), ("llava", "sample_vcd", "mc_verb", None),
                    ("qwen", "vcd", "yn_obj", None)]
    assert {r["condition"] for r in runs} == {"clean"}  # the default conditions: clean only
    notes = {(r["model"], r["variant"]): r["plain_note"] for r in runs}
    assert notes[("llava", "vcd")] == ""
    assert "no configured variant equals 'sample_vcd' without vcd" in notes[("llava", "sample_vcd")]
    assert notes[("qwen", "vcd")] == "qwen does not run the plain counterpart 'default'"
    # each run's plausibility cut, the model's own where it sets one: it moves the share of KL = 0
    assert {(r["model"], r["variant"]): r["beta"] for r in runs} == {
        ("llava", "vcd"): 0.1, ("llava", "sample_vcd"): 0.2, ("qwen", "vcd"): 0.3}


def test_a_run_without_any_vcd_variant_plans_nothing():
    cfg = config({"default": {}, "beam": {"decoding": "beam"}}, {"bins": 10})
    settings = vcd_divergence_settings(cfg)
    assert vcd_variants(cfg) == []
    assert divergence_runs(cfg, {"llava": ["default", "beam"]}, lambda c, q, m: True, settings) == []
    # a VCD variant configured but run by no model: nothing either
    cfg = config({"default": {}, "vcd": {"vcd": {}}})
    assert divergence_runs(cfg, {"llava": ["default"]}, lambda c, q, m: True, settings) == []


# ---- KL statistics ------------------------------------------------------------------------------------------


def test_kl_shares_quantiles_and_dropped_rows():
    ids = [f"q{i}" for i in range(10)]
    kl = [0.0] * 6 + [0.0, 0.01, 0.2, None]
    plausible = [1] * 6 + [2, 2, 3, None]
    errors = [None] * 9 + ["CUDA out of memory"]
    table = predictions(ids, ["yes"] * 10, kl, plausible, errors)
    rows = kl_rows(table, "vcd.parquet")
    assert list(rows.question_id) == ids[:9]
    stats = kl_statistics(rows, len(table))
    assert stats["n"] == 9 and stats["n_dropped"] == 1
    assert stats["n_kl_zero"] == 7 and stats["share_kl_zero"] == pytest.approx(7 / 9)
    assert stats["n_plausible_one"] == 6 and stats["share_plausible_one"] == pytest.approx(6 / 9)
    assert stats["n_kl_zero_plausible_many"] == 1  # q6: the contrast left the renormalised head unchanged
    values = np.array([0.0] * 7 + [0.01, 0.2])
    assert stats["kl_median"] == 0.0
    assert stats["kl_q90"] == pytest.approx(np.quantile(values, 0.9))
    assert stats["kl_max"] == 0.2 and stats["kl_mean"] == pytest.approx(0.21 / 9)
    assert stats["kl_median_positive"] == pytest.approx(0.105)
    assert stats["plausible_mean"] == pytest.approx((6 + 2 + 2 + 3) / 9)


def test_both_kl_directions_are_reported(tmp_path):
    """The paper's "KL divergence between the original p_theta and the contrasted p_vcd" names no direction:
    vcd_kl (KL(q || p~)) and vcd_kl_reverse (KL(p~ || q)) each get their quantiles, in the table and its page;
    a table written before the reverse one was stored reads with it null."""
    ids = ["a", "b", "c", "d"]
    table = predictions(ids, ["yes"] * 4, [0.0, 0.0671, 0.2, 0.0], [1, 2, 3, 2]).assign(
        vcd_kl_reverse=[0.0, 0.0826, 0.3, 0.0])
    rows = kl_rows(table, "vcd.parquet")
    assert rows.kl_reverse.tolist() == [0.0, 0.0826, 0.3, 0.0]
    stats = kl_statistics(rows, len(table))
    assert (stats["kl_max"], stats["kl_reverse_max"]) == (0.2, 0.3)
    assert stats["kl_median"] == pytest.approx(0.0671 / 2) and stats["kl_reverse_median"] == pytest.approx(0.0413)
    assert stats["kl_reverse_mean"] == pytest.approx(0.3826 / 4)
    assert stats["kl_reverse_q90"] == pytest.approx(np.quantile([0.0, 0.0826, 0.3, 0.0], 0.9))
    old = kl_statistics(kl_rows(predictions(ids, ["yes"] * 4, [0.0, 0.0671, 0.2, 0.0], [1, 2, 3, 2]), "old"), 4)
    assert math.isnan(old["kl_reverse_median"]) and old["kl_median"] == stats["kl_median"]
    with pytest.raises(ValueError, match=r"question 'b': a negative vcd_kl_reverse"):
        kl_rows(table.assign(vcd_kl_reverse=[0.0, -0.1, 0.3, 0.0]), "vcd.parquet")
    with pytest.raises(ValueError, match=r"question 'a': vcd_kl_reverse > 0 with a one-token plausibility set"):
        kl_rows(table.assign(vcd_kl_reverse=[0.1, 0.0826, 0.3, 0.0]), "vcd.parquet")
    run = {"model": "m", "variant": "vcd", "condition": "clean", "qset": "yn_obj", "plain_variant": None,
           "plain_note": "none", "predictions": table, "plain": None, "questions": None, "where": "vcd.parquet"}
    summary, _ = vcd_divergence_tables([run])
    write_table(summary, tmp_path / "summary.parquet", VCD_DIVERGENCE)
    page = divergence_report_table(read_table(tmp_path / "summary.parquet", VCD_DIVERGENCE)).iloc[0]
    assert (page["KL(q‖p~) max"], page["KL(p~‖q) max"]) == ("0.2", "0.3")


def test_kl_rows_refuse_impossible_values_naming_the_file_and_question():
    ids = ["a", "b"]
    with pytest.raises(ValueError, match=r"vcd.parquet: question 'b': a negative vcd_kl"):
        kl_rows(predictions(ids, ["yes", "no"], [0.0, -0.1], [1, 2]), "vcd.parquet")
    with pytest.raises(ValueError, match=r"question 'a': vcd_kl > 0 with a one-token plausibility set"):
        kl_rows(predictions(ids, ["yes", "no"], [0.3, 0.1], [1, 2]), "vcd.parquet")
    with pytest.raises(ValueError, match=r"question 'b': vcd_plausible below 1"):
        kl_rows(predictions(ids, ["yes", "no"], [0.0, 0.0], [1, 0]), "vcd.parquet")
    with pytest.raises(ValueError, match=r"plain.parquet: no vcd_kl on any answered row"):
        kl_rows(predictions(ids, ["yes", "no"]), "plain.parquet")
    # only error rows: nothing to measure, not an error
    assert kl_rows(predictions(ids, ["unknown"] * 2, errors=["x", "y"]), "vcd.parquet").empty


# ---- flips --------------------------------------------------------------------------------------------------


def test_flips_count_changed_answers_on_questions_both_runs_answered():
    q = questions("yn_verb", ["yes", "no", "no", "yes", "no", "yes"])
    ids = list(q.question_id)
    plain = predictions(ids, ["yes", "yes", "no", "no", "no", "yes"])
    vcd = predictions(ids, ["no", "yes", "yes", "yes", "unknown", "yes"], kl=[0.1, 0, 0.2, 0.3, None, 0],
                      plausible=[2, 1, 2, 3, None, 1], errors=[None, None, None, None, "boom", None])
    stats = flip_statistics(vcd, plain, q, kl_rows(vcd))
    assert stats["n_paired"] == 5  # the error row is not a flip
    assert stats["n_flips"] == 3 and stats["flip_share"] == pytest.approx(3 / 5)
    assert stats["yes_to_no"] == 1 and stats["no_to_yes"] == 2
    assert stats["n_fixed"] == 1  # question 3: plain no, VCD yes, answer yes
    assert stats["n_broken"] == 2  # question 0 (yes -> no) and 2 (no -> yes, answer no)
    assert stats["n_flips_plausible_one"] == 0
    # an independent count: sklearn's confusion matrix of plain (rows) against VCD (columns)
    both = slice(0, 4)
    matrix = confusion_matrix(plain.prediction[both], vcd.prediction[both], labels=["yes", "no"])
    assert (stats["yes_to_no"], stats["no_to_yes"]) == (matrix[0, 1], matrix[1, 0])


def test_mc_flips_have_no_yes_no_direction():
    q = questions("mc_verb", ["A", "B", "C"])
    ids = list(q.question_id)
    vcd = predictions(ids, ["A", "C", "C"], kl=[0.0, 0.5, 0.0], plausible=[1, 2, 1])
    stats = flip_statistics(vcd, predictions(ids, ["A", "B", "D"]), q, kl_rows(vcd))
    assert stats["n_flips"] == 2 and stats["yes_to_no"] is None and stats["no_to_yes"] is None
    assert stats["n_fixed"] == 1 and stats["n_broken"] == 1
    assert stats["n_flips_plausible_one"] == 1  # question 2 flipped although one token survived the cut


def test_flips_refuse_a_question_answered_twice():
    q = questions("yn_obj", ["yes", "no"])
    vcd = predictions(["yn_obj-0", "yn_obj-0"], ["yes", "no"], [0.0, 0.0], [1, 1])
    with pytest.raises(ValueError, match=r"vcd.parquet vs default: VCD run answers question_id 'yn_obj-0' twice"):
        flip_statistics(vcd, predictions(list(q.question_id), ["yes", "no"]), q, kl_rows(vcd),
                        where="vcd.parquet vs default")


# ---- histogram and tables -----------------------------------------------------------------------------------


def test_histogram_has_an_exact_zero_bin_and_shared_log_bins():
    a = np.array([0.0, 0.0, 0.0, 2e-4, 0.03])
    b = np.array([0.0, 1.5])
    edges = kl_bin_edges([a, b], bins=5)
    assert edges[0] == pytest.approx(1e-4) and edges[-1] == pytest.approx(10.0)  # whole decades
    assert np.allclose(np.diff(np.log10(edges)), 1.0)
    rows = pd.DataFrame(histogram_rows(a, edges))
    assert (rows.bin_left.iloc[0], rows.bin_right.iloc[0], rows["count"].iloc[0]) == (0.0, 0.0, 3)
    assert rows["count"].sum() == len(a) and rows.share.sum() == pytest.approx(1.0)
    assert rows.share.iloc[0] == pytest.approx(0.6)
    assert len(kl_bin_edges([np.zeros(4)], bins=5)) == 0  # nothing positive: only the zero bin
    assert len(histogram_rows(np.zeros(4), np.zeros(0))) == 1


def _runs():
    """tiny_llava runs VCD and its plain counterpart on yn_obj and mc_verb; qwen runs VCD only."""
    yn = questions("yn_obj", ["yes", "no", "no", "no"])
    mc = questions("mc_verb", ["A", "B"])
    runs = []
    for model, plain_variant, note, beta in (("tiny_llava", "default", "", 0.1),
                                             ("qwen", None, "qwen does not run ...", 0.2)):
        for q, vcd_answers, plain_answers, kl, plausible in (
            (yn, ["yes", "yes", "no", "no"], ["yes", "no", "no", "no"], [0.0, 0.4, 0.0, 0.0], [1, 2, 1, 1]),
            (mc, ["A", "A"], ["A", "B"], [0.0, 0.02], [1, 3]),
        ):
            ids = list(q.question_id)
            runs.append({
                "model": model, "variant": "vcd", "condition": "clean", "qset": q.qset.iloc[0],
                "plain_variant": plain_variant, "plain_note": note, "beta": beta, "questions": q,
                "where": f"{model}.parquet",
                "predictions": predictions(ids, vcd_answers, kl, plausible),
                "plain": predictions(ids, plain_answers) if plain_variant else None,
            })
    return runs


def test_tables_per_set_and_pooled_with_the_paper_number_on_the_pooled_row(tmp_path):
    summary, hist = vcd_divergence_tables(_runs(), bins=4, paper_names={"qwen": "Qwen-VL-Chat"})
    assert list(summary.qset) == ["yn_obj", "mc_verb", "yn_obj+mc_verb"] * 2
    llava = summary[summary.model.eq("tiny_llava")].set_index("qset")
    pooled = llava.loc["yn_obj+mc_verb"]
    assert pooled.n == 6 and pooled.n_kl_zero == 4 and pooled.share_kl_zero == pytest.approx(4 / 6)
    assert pooled.n_plausible_one == 4
    assert pooled.n_paired == 6 and pooled.n_flips == 2 and pooled.flip_share == pytest.approx(2 / 6)
    assert (pooled.yes_to_no, pooled.no_to_yes) == (0, 1)  # the MC flip has no direction
    assert pd.isna(llava.loc["mc_verb"].yes_to_no) and llava.loc["yn_obj"].no_to_yes == 1
    assert pooled.n_fixed == 0 and pooled.n_broken == 2  # both flips leave a right plain answer
    assert pooled.paper_share_kl_zero == pytest.approx(0.93) and pooled.paper_n == 20000
    assert pooled.paper_model == "Qwen-VL-Chat" and not pooled.paper_model_match
    assert math.isnan(llava.loc["yn_obj"].paper_share_kl_zero) and pd.isna(llava.loc["yn_obj"].paper_model)
    qwen = summary[summary.model.eq("qwen")]
    assert qwen.paper_model_match.all()  # models.qwen.paper_name is the paper's model
    assert qwen.n_flips.isna().all() and qwen.plain_note.eq("qwen does not run ...").all()
    # the histogram: every series' shares add up to 1, its zero bin is share_kl_zero, bins shared
    for (model, qset), part in hist.groupby(["model", "qset"]):
        row = summary[(summary.model == model) & (summary.qset == qset)].iloc[0]
        assert part.share.sum() == pytest.approx(1.0) and part["count"].sum() == row.n
        assert part.share.iloc[0] == pytest.approx(row.share_kl_zero)
    assert hist.groupby(["model", "qset"]).size().nunique() == 1 == len(set(hist.groupby(["model", "qset"]).bin_left.apply(tuple)))
    # the schemas take them, and they read back
    write_table(summary, tmp_path / "summary.parquet", VCD_DIVERGENCE)
    write_table(hist, tmp_path / "hist.parquet", VCD_KL_HIST)
    back = read_table(tmp_path / "summary.parquet", VCD_DIVERGENCE)
    assert back.yes_to_no.isna().sum() == 1 + 3  # llava's mc_verb row, and qwen's three rows (no flips)
    assert list(overall_rows(back).qset) == ["yn_obj+mc_verb"] * 2
    # the report's page: percent beside the paper's, counts stay integers where some are missing
    page = divergence_report_table(back).set_index(["model", "sets"])
    assert page.loc[("tiny_llava", "yn_obj+mc_verb"), "KL = 0 (%)"] == pytest.approx(66.7)
    assert page.loc[("tiny_llava", "yn_obj+mc_verb"), "paper KL = 0 (%)"] == 93.0
    assert str(page["yes→no"].dtype) == "Int64" and pd.isna(page.loc[("tiny_llava", "mc_verb"), "yes→no"])
    assert page["β (cut)"].groupby(level="model").first().to_dict() == {"qwen": 0.2, "tiny_llava": 0.1}


def test_one_set_only_gets_the_paper_number_on_its_own_row():
    runs = [run for run in _runs() if run["qset"] == "yn_obj" and run["model"] == "tiny_llava"]
    summary, _ = vcd_divergence_tables(runs)
    assert list(summary.qset) == ["yn_obj"] and summary.paper_share_kl_zero.iloc[0] == pytest.approx(0.93)


def test_the_figure_names_each_runs_beta_beside_the_official_scripts(monkeypatch, tmp_path):
    """β sets how often the KL is exactly 0 (a one-token plausibility set): each run's is named under it, and the
    heading says that VCD's default is 0.1 and its official LLaVA-1.5 POPE script runs 0.2."""
    import verbmirage.analysis.vcd_divergence as divergence

    saved = []
    monkeypatch.setattr(divergence, "save_figure", lambda figure, path: saved.append(figure))
    summary, hist = vcd_divergence_tables(_runs(), bins=4)
    draw_vcd_divergence_figure(summary, hist, tmp_path / "vcd.png")
    (figure,) = saved
    assert "0.1, while its official LLaVA-1.5 POPE script runs 0.2" in " ".join(figure.get_suptitle().split())
    ticks = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert ticks == ["tiny_llava\nvcd, β 0.1", "qwen\nvcd, β 0.2"]


def test_figure_is_drawn_with_and_without_flips(tmp_path, monkeypatch):
    from verbmirage.analysis import vcd_divergence

    summary, hist = vcd_divergence_tables(_runs(), bins=4)
    path = tmp_path / "vcd.png"
    saved = []
    real = vcd_divergence.save_figure
    monkeypatch.setattr(vcd_divergence, "save_figure", lambda figure, where: (saved.append(figure), real(figure, where)))
    draw_vcd_divergence_figure(summary, hist, path, {"tiny_llava": "tiny model with RANDOM weights"})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    # both runs' KL distributions are the same here: each curve keeps a look of its own, so neither hides
    curves = [patch for patch in saved[0].axes[1].patches if type(patch).__name__ == "StepPatch"]
    assert len(curves) == 2 and len({(c.get_linestyle(), c.get_linewidth()) for c in curves}) == 2
    zeros = summary.assign(n_paired=None, n_flips=None, flip_share=math.nan)
    draw_vcd_divergence_figure(zeros, hist[hist.bin_right.eq(0)], tmp_path / "flat.png")  # no KL > 0, no flips
    assert (tmp_path / "flat.png").stat().st_size > 5000


# ---- the paper ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not PAPER_TEXT.is_file(), reason="the paper's text is not present")
def test_the_paper_numbers_are_the_papers_sentence():
    text = PAPER_TEXT.read_text()
    assert "of 20K samples, and find that the KL divergence of 18.6K samples is 0" in text
    assert (PAPER.n, PAPER.n_kl_zero) == (20_000, 18_600) and PAPER.share_kl_zero == pytest.approx(0.93)
    assert "we compute Qwen-VL’s KL divergence" in text and PAPER.model == "Qwen-VL-Chat"
