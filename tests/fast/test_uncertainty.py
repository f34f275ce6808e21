"""Token uncertainty (Figs. 9, 12) and field of view (Fig. 10): the notes' oracles, sklearn's AUROC, the tables."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from verbmirage.analysis.fov import crop_area_fractions, fov_report_table, fov_tables, shared_questions
from verbmirage.analysis.fov_settings import fov_settings
from verbmirage.analysis.uncertainty import (
    auroc,
    bin_edges,
    confidence_rows,
    histogram_rows,
    read_runs,
    uncertainty_tables,
)
from verbmirage.analysis.uncertainty_settings import UncertaintySettings, token_probability_models, uncertainty_settings
from verbmirage.analysis.uncertainty_figures import draw_fov_figure, draw_uncertainty_figures, uncertainty_roles
from verbmirage.core.errors import ConfigError
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set
from verbmirage.core.schemas import FOV, FOV_ROWS, METRICS, PREDICTIONS, UNCERTAINTY_HIST
from verbmirage.evaluation.metrics import BootstrapSettings

NO_BOOTSTRAP = BootstrapSettings(resamples=0)


def yn_questions(qset: str, answers: list[str], images: list[str] | None = None) -> pd.DataFrame:
    n = len(answers)
    return pd.DataFrame({
        "qset": qset, "question_id": [f"{qset}-{i}" for i in range(n)],
        "image_id": images or [f"img{i}" for i in range(n)], "group_id": [f"{qset}-{i}" for i in range(n)],
        "rotation": 0, "answer": answers, "rare": False, "common": False,
    })


def mc_questions(qset: str, groups: dict[str, tuple[str, list[str]]]) -> pd.DataFrame:
    """groups: group_id -> (image_id, the answer letter of each rotation)."""
    rows = []
    for group, (image, answers) in groups.items():
        for rotation, answer in enumerate(answers):
            rows.append({"qset": qset, "question_id": f"{group}-r{rotation}", "image_id": image, "group_id": group,
                         "rotation": rotation, "answer": answer, "rare": False, "common": False})
    return pd.DataFrame(rows)


def predictions(question_ids, answers, confidence, rule="logits", errors=None) -> pd.DataFrame:
    n = len(question_ids)
    errors = errors or [None] * n
    return pd.DataFrame({
        "question_id": list(question_ids),
        "prediction": ["unknown" if e else a for a, e in zip(answers, errors)],
        "confidence": [None if e else c for c, e in zip(confidence, errors)],
        "error": errors,
        "parse_rule": ["error" if e else rule for e in errors],
    })


def metric(metrics: pd.DataFrame, subset: str, name: str) -> float:
    chosen = metrics[(metrics.subset == subset) & (metrics.metric == name)]
    assert len(chosen) == 1, (subset, name, chosen)
    return float(chosen.value.iloc[0])


# ---- notes oracle -----------------------------------------------------------------------------------


def test_notes_oracle_means_and_auroc_per_predicted_answer():
    # (yes, correct, .9), (yes, wrong, .6), (no, correct, .7), (no, wrong, .55)
    questions = yn_questions("yn_obj", ["yes", "no", "no", "yes"])
    answered = predictions(questions.question_id, ["yes", "yes", "no", "no"], [0.9, 0.6, 0.7, 0.55])
    keys = {"model": "m", "variant": "default", "condition": "clean", "qset": "yn_obj"}
    hist, metrics = uncertainty_tables([(keys, questions, answered)], UncertaintySettings(), NO_BOOTSTRAP)
    assert metric(metrics, "pred_yes:correct", "conf_mean") == pytest.approx(0.9)
    assert metric(metrics, "pred_yes:hallucinated", "conf_mean") == pytest.approx(0.6)
    assert metric(metrics, "pred_no:correct", "conf_mean") == pytest.approx(0.7)
    assert metric(metrics, "pred_no:hallucinated", "conf_mean") == pytest.approx(0.55)
    assert metric(metrics, "pred_yes", "conf_auroc") == 1.0
    assert metric(metrics, "pred_no", "conf_auroc") == 1.0
    assert metric(metrics, "all", "n_dropped") == 0
    assert set(metrics.dataset) == {"hico"} and set(metrics.qset) == {"yn_obj"}
    assert hist["count"].sum() == 4


def test_auroc_equals_sklearn_with_ties():
    rng = np.random.default_rng(0)
    scores = np.round(rng.random(300), 1)  # many ties
    correct = rng.random(300) < scores  # correctness that depends on u
    ours = auroc(scores[correct], scores[~correct])
    assert ours == pytest.approx(roc_auc_score(correct, scores), abs=1e-12)
    assert 0.5 < ours < 1.0
    assert math.isnan(auroc([0.5], []))


def test_conf_mean_interval_is_an_image_bootstrap_around_the_mean():
    questions = yn_questions("yn_obj", ["yes"] * 40)
    u = np.linspace(0.5, 1.0, 40)
    answered = predictions(questions.question_id, ["yes"] * 40, u)
    keys = {"model": "m", "variant": "default", "condition": "clean", "qset": "yn_obj"}
    _, metrics = uncertainty_tables([(keys, questions, answered)], UncertaintySettings(),
                                       BootstrapSettings(resamples=200, seed=0))
    row = metrics[(metrics.subset == "pred_yes:correct") & (metrics.metric == "conf_mean")].iloc[0]
    assert row.value == pytest.approx(u.mean())
    assert row.ci_low < row.value < row.ci_high and row.ci_high - row.ci_low < 0.2
    assert row.n == 40
    assert metric(metrics, "pred_yes:correct", "conf_median") == pytest.approx(np.median(u))
    assert math.isnan(metric(metrics, "pred_yes", "conf_auroc"))  # no hallucinated row: undefined


# ---- histograms ---------------------------------------------------------------------------------------


def test_histogram_shares_bins_and_density_integrates_to_one():
    edges = bin_edges(20)
    assert len(edges) == 21 and edges[0] == 0 and edges[-1] == 1
    questions = yn_questions("yn_obj", ["yes"] * 5)
    answered = predictions(questions.question_id, ["yes", "yes", "yes", "no", "no"], [1.0, 0.97, 0.51, 0.5, 0.0])
    rows = confidence_rows(questions, answered)
    hist = pd.DataFrame(histogram_rows(rows, {"model": "m"}, edges))
    yes = hist[(hist.group == "pred_yes") & hist.correct]
    assert yes["count"].sum() == 3 and yes["count"].iloc[-1] == 2  # u = 1.0 falls in the last bin
    assert (yes.density * (yes.bin_right - yes.bin_left)).sum() == pytest.approx(1.0)
    no = hist[(hist.group == "pred_no") & ~hist.correct]
    assert no["count"].sum() == 2 and no["count"].iloc[0] == 1 and no["count"].iloc[10] == 1
    assert set(zip(hist.bin_left, hist.bin_right)) <= set(zip(edges[:-1], edges[1:]))


def test_pool_yn_joins_the_yes_no_sets_and_mc_stays_per_set():
    obj, verb = yn_questions("yn_obj", ["yes", "no"]), yn_questions("yn_verb", ["no", "no"])
    mc = mc_questions("mc_verb", {"g1": ("img0", ["A", "B"])})
    runs = [
        ({"model": "m", "variant": "default", "condition": "clean", "qset": "yn_obj"}, obj,
         predictions(obj.question_id, ["yes", "yes"], [0.9, 0.8])),
        ({"model": "m", "variant": "default", "condition": "clean", "qset": "yn_verb"}, verb,
         predictions(verb.question_id, ["no", "yes"], [0.7, 0.6])),
        ({"model": "m", "variant": "default", "condition": "clean", "qset": "mc_verb"}, mc,
         predictions(mc.question_id, ["A", "A"], [0.4, 0.3])),
    ]
    hist, metrics = uncertainty_tables(runs, UncertaintySettings(pool_yn=True), NO_BOOTSTRAP)
    assert set(hist.qset) == {"yn_obj+yn_verb", "mc_verb"}
    assert hist[hist.qset == "yn_obj+yn_verb"]["count"].sum() == 4
    assert metric(metrics[metrics.qset == "yn_obj+yn_verb"], "pred_yes:hallucinated", "conf_mean") == pytest.approx(0.7)
    assert metric(metrics, "mc:correct", "conf_mean") == pytest.approx(0.4)
    separate, _ = uncertainty_tables(runs, UncertaintySettings(pool_yn=False), NO_BOOTSTRAP)
    assert set(separate.qset) == {"yn_obj", "yn_verb", "mc_verb"}
    assert separate["count"].sum() == hist["count"].sum() == 6


def test_only_models_with_token_probabilities_are_covered():
    models = {"always_yes": {"backend": "always_yes"}, "l": {"backend": "llava"}, "random": {"backend": "random"},
              "prior": {"backend": "prior"}, "clip": {"backend": "clip"}, "gpt": {"backend": "openai"},
              "q": {"backend": "qwen_vl_chat"}, "mine": {"backend": "pkg.mod:Model"}}
    assert token_probability_models(models) == ["l", "gpt", "q", "mine"]


def test_error_rows_are_counted_as_dropped_and_other_answers_kept_apart():
    questions = yn_questions("yn_obj", ["yes", "no", "yes", "no"])
    answered = predictions(questions.question_id, ["yes", "no", "no", "unknown"], [0.9, 0.8, 0.7, 0.3],
                           errors=[None, "OSError: x", None, None])
    keys = {"model": "llava", "variant": "default", "condition": "clean", "qset": "yn_obj"}
    hist, metrics = uncertainty_tables([(keys, questions, answered)], UncertaintySettings(), NO_BOOTSTRAP)
    assert hist["count"].sum() == 3  # the error row is in no histogram
    assert metric(metrics, "all", "n_dropped") == 1
    assert metrics[(metrics.metric == "n_dropped")].n.iloc[0] == 4
    # an answer that is neither yes nor no (an unparsed text) is its own group, always hallucinated
    other = hist[hist.group == "pred_other"]
    assert other["count"].sum() == 1 and not other.correct.any()
    assert metric(metrics, "pred_other:hallucinated", "conf_mean") == pytest.approx(0.3)


def test_a_confidence_outside_zero_one_names_the_question():
    questions = yn_questions("yn_obj", ["yes", "no"])
    answered = predictions(questions.question_id, ["yes", "no"], [0.9, 1.5])
    with pytest.raises(ValueError, match="yn_obj-1.*not a probability"):
        confidence_rows(questions, answered, "p.parquet")
    with pytest.raises(ValueError, match="p.parquet.*answer no known question"):
        confidence_rows(questions.iloc[:1], answered, "p.parquet")


def test_tables_fit_their_schemas(tmp_path):
    questions = yn_questions("yn_obj", ["yes", "no"])
    answered = predictions(questions.question_id, ["yes", "yes"], [0.9, 0.6])
    keys = {"model": "m", "variant": "default", "condition": "clean", "qset": "yn_obj"}
    hist, metrics = uncertainty_tables([(keys, questions, answered)], UncertaintySettings(), NO_BOOTSTRAP)
    write_table(hist, tmp_path / "hist.parquet", UNCERTAINTY_HIST)
    write_table(metrics, tmp_path / "metrics.parquet", METRICS)
    assert len(read_table(tmp_path / "hist.parquet", UNCERTAINTY_HIST)) == 2 * 20
    empty_hist, empty_metrics = uncertainty_tables([], UncertaintySettings(), NO_BOOTSTRAP)
    write_table(empty_hist, tmp_path / "empty.parquet", UNCERTAINTY_HIST)
    write_table(empty_metrics, tmp_path / "empty_metrics.parquet", METRICS)


# ---- config ---------------------------------------------------------------------------------------------


def test_read_runs_pairs_each_run_with_its_tables_and_reads_a_question_table_once(demo_anno, tmp_path):
    """The scripts' reading of a plan's runs: one prediction file per run (uncertainty) or one per condition
    (field of view), real Parquet tables under their schemas."""
    from verbmirage.inference.runs import predict
    from verbmirage.models import create_model

    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(6)
    write_table(questions, tmp_path / "yn_obj.parquet", QUESTIONS)
    answered = {}
    for condition, backend in (("clean", "always_yes"), ("crop", "random")):
        answered[condition] = str(tmp_path / f"{condition}.parquet")
        write_table(predict(questions, create_model(backend, {"backend": backend}), None), answered[condition],
                    PREDICTIONS)
    run = {"model": "m", "variant": "default", "qset": "yn_obj", "questions": str(tmp_path / "yn_obj.parquet")}
    single = read_runs([{**run, "condition": c, "predictions": answered[c]} for c in answered],
                       ("model", "condition"), where=True)
    assert [keys for keys, _, _ in single] == [{"model": "m", "condition": c, "where": answered[c]} for c in answered]
    assert single[0][1] is single[1][1]  # the question table read once for both runs
    pd.testing.assert_frame_equal(single[0][1], read_table(run["questions"], QUESTIONS))
    for (_, _, table), condition in zip(single, answered):
        pd.testing.assert_frame_equal(table, read_table(answered[condition], PREDICTIONS))
    [(keys, _, tables)] = read_runs([{**run, "predictions": answered}], ("model", "variant", "qset"))
    assert keys == {"model": "m", "variant": "default", "qset": "yn_obj"} and list(tables) == ["clean", "crop"]
    assert (tables["clean"].prediction == "yes").all() and not tables["crop"].equals(tables["clean"])


def base_config(**analysis) -> dict:
    return {
        "datasets": {"hico": {"root": "r", "det_root": "d"}},
        "questions": {"sets": ["yn_obj", "yn_verb", "mc_obj", "mc_verb"]},
        "conditions": {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.1}},
        "models": {"tiny_llava": {"backend": "llava"}, "prior": {"backend": "prior"}},
        "analysis": analysis,
    }


def test_settings_are_checked_against_the_config():
    assert uncertainty_settings(base_config()) is None
    settings = uncertainty_settings(base_config(uncertainty={"bins": 10}))
    assert settings.bins == 10 and settings.pool_yn and settings.conditions == ("clean",)
    with pytest.raises(ConfigError, match="analysis.uncertainty.models.*gpt"):
        uncertainty_settings(base_config(uncertainty={"models": ["gpt"]}))
    with pytest.raises(ConfigError, match="analysis.uncertainty.conditions"):
        uncertainty_settings(base_config(uncertainty={"conditions": ["blur"]}))
    # a figure may show another model than its role's: one of the analysis's, with token probabilities
    assert uncertainty_settings(base_config(uncertainty={"figures": {"fig9": "tiny_llava"}})).figures == (
        (9, "tiny_llava"),)
    with pytest.raises(ConfigError, match=r"analysis.uncertainty.figures.fig12: 'gpt' is not among"):
        uncertainty_settings(base_config(uncertainty={"figures": {"fig12": "gpt"}}))
    with pytest.raises(ConfigError, match=r"analysis.uncertainty.figures.fig9: 'prior' has no token probability"):
        uncertainty_settings(base_config(uncertainty={"figures": {"fig9": "prior"}}))
    asked = {"clean": ["yn_obj", "yn_verb", "mc_obj", "mc_verb"], "crop": ["mc_obj", "mc_verb"]}
    assert fov_settings(base_config(fov={}), asked).conditions == ("clean", "crop")
    with pytest.raises(ConfigError, match=r"analysis.fov.qsets: \['yn_obj'\] are not asked under condition crop"):
        fov_settings(base_config(fov={"qsets": ["yn_obj", "mc_obj"]}), asked)
    with pytest.raises(ConfigError, match="at least one crop"):
        fov_settings(base_config(fov={"conditions": ["clean"]}), asked)
    no_boxes = base_config(fov={})
    no_boxes["datasets"]["hico"]["det_root"] = ""
    with pytest.raises(ConfigError, match="det_root"):
        fov_settings(no_boxes, asked)


# ---- field of view --------------------------------------------------------------------------------------


def tags(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).assign(image=lambda f: f.image_id + ".jpg")


def test_crop_area_matches_the_notes_crop_oracle():
    table = tags([
        {"image_id": "a", "width": 640, "height": 480, "union_x1": 101, "union_y1": 51, "union_x2": 300,
         "union_y2": 250, "single_instance": True},
        {"image_id": "b", "width": 200, "height": 200, "union_x1": 1, "union_y1": 1, "union_x2": 100,
         "union_y2": 100, "single_instance": True},
        {"image_id": "c", "width": 200, "height": 200, "union_x1": 1, "union_y1": 1, "union_x2": 100,
         "union_y2": 100, "single_instance": False},
    ])
    crop = crop_area_fractions(table, {"type": "crop", "margin": 0.1, "qsets": ["mc_obj"]})
    assert crop["a"] == pytest.approx(240 * 240 / (640 * 480))  # (80, 30, 320, 270)
    wide = crop_area_fractions(table, {"type": "crop", "margin": 0.5})
    assert wide["b"] == pytest.approx(150 * 150 / (200 * 200))  # (0, 0, 150, 150)
    assert "c" not in crop.index
    assert crop_area_fractions(table, {"type": "clean"}).to_dict() == {"a": 1.0, "b": 1.0}


def fov_fixture():
    """Two single-instance images (a, b), one other (c); mc_verb with 2 rotations per group.

    Group gb's crop lost rotation 1 (a failed row would still be there; a missing one removes the group).
    """
    image_tags = tags([
        {"image_id": i, "width": 100, "height": 100, "union_x1": 41, "union_y1": 41, "union_x2": 60,
         "union_y2": 60, "single_instance": i != "c"} for i in "abc"
    ])
    questions = mc_questions("mc_verb", {"ga": ("a", ["A", "B"]), "gb": ("b", ["A", "B"]), "gc": ("c", ["A", "B"]),
                                         "ga2": ("a", ["B", "A"])})
    clean = predictions(questions.question_id, ["A", "B", "A", "B", "A", "A", "B", "B"],
                        [0.9, 0.8, 0.7, 0.6, 0.5, 0.5, 0.4, 0.3])
    crop_ids = ["ga-r0", "ga-r1", "gb-r0", "ga2-r0", "ga2-r1"]
    crop = predictions(crop_ids, ["A", "A", "A", "B", "B"], [0.8, 0.5, 0.7, 0.6, 0.2],
                       errors=[None, None, None, None, "OSError: x"])
    return image_tags, questions, {"clean": clean, "crop": crop}


def test_fov_compares_the_same_questions_in_every_condition():
    image_tags, questions, answered = fov_fixture()
    shared = shared_questions(questions, image_tags, answered)
    assert set(shared.question_id) == {"ga-r0", "ga-r1", "ga2-r0", "ga2-r1"}  # c not single; gb incomplete
    conditions = {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.0}}
    keys = {"model": "llava", "variant": "default", "qset": "mc_verb"}
    fov, rows = fov_tables([(keys, questions, answered)], image_tags, conditions, NO_BOOTSTRAP, ["llava"])
    assert list(fov.condition) == ["clean", "crop"]
    for condition in conditions:
        assert set(rows.question_id[rows.condition == condition]) == set(shared.question_id)
    clean, crop = fov.iloc[0], fov.iloc[1]
    assert clean.n == crop.n == 4 and clean.n_groups == crop.n_groups == 2
    # clean: ga A,B right (circular), ga2 rotation 0 B right, rotation 1 B wrong -> plain 2/2, circular 1/2
    assert clean.acc_plain == 1.0 and clean.acc_circular == 0.5
    # crop: ga A right, A wrong; ga2 B right, error row wrong -> plain 2/2, circular 0/2
    assert crop.acc_plain == 1.0 and crop.acc_circular == 0.0
    assert clean.crop_area_frac_mean == 1.0 and math.isnan(clean.margin)
    assert crop.crop_area_frac_mean == pytest.approx(0.04) and crop.margin == 0.0
    assert clean.conf_mean_correct == pytest.approx((0.9 + 0.8 + 0.4) / 3)
    assert clean.conf_mean_hallucinated == pytest.approx(0.3)
    assert crop.conf_mean_correct == pytest.approx((0.8 + 0.6) / 2)
    assert crop.conf_mean_hallucinated == pytest.approx(0.5)
    # paired on rows usable in both (the crop's error row is not): (0.8-0.9) + (0.5-0.8) + (0.6-0.4) over 3
    assert crop.delta_conf_mean == pytest.approx((-0.1 - 0.3 + 0.2) / 3)
    assert math.isnan(clean.delta_conf_mean)
    table = fov_report_table(fov)
    assert len(table) == 1
    assert table.circular_change.iloc[0] == pytest.approx(-50.0)
    assert table.conf_change.iloc[0] == pytest.approx(100 * crop.delta_conf_mean)


def test_fov_delta_interval_and_schema(tmp_path):
    image_tags = tags([{"image_id": f"i{k}", "width": 100, "height": 100, "union_x1": 1, "union_y1": 1,
                        "union_x2": 50, "union_y2": 50, "single_instance": True} for k in range(30)])
    questions = yn_questions("yn_obj", ["yes"] * 30, [f"i{k}" for k in range(30)])
    u = np.linspace(0.6, 0.9, 30)
    answered = {"clean": predictions(questions.question_id, ["yes"] * 30, u),
                "crop": predictions(questions.question_id, ["yes"] * 15 + ["no"] * 15, u - 0.1)}
    conditions = {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.1}}
    fov, rows = fov_tables([({"model": "m", "variant": "default", "qset": "yn_obj"}, questions, answered)],
                           image_tags, conditions, BootstrapSettings(resamples=100, seed=0), ["m"])
    crop = fov.iloc[1]
    assert crop.delta_conf_mean == pytest.approx(-0.1)
    assert crop.delta_ci_low == pytest.approx(-0.1) and crop.delta_ci_high == pytest.approx(-0.1)  # constant shift
    assert crop.acc_plain == 0.5 and math.isnan(crop.acc_circular)
    write_table(fov, tmp_path / "fov.parquet", FOV)
    write_table(rows, tmp_path / "rows.parquet", FOV_ROWS)


def test_fov_keeps_baselines_without_confidence():
    image_tags, questions, answered = fov_fixture()
    conditions = {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.0}}
    fov, rows = fov_tables([({"model": "prior", "variant": "default", "qset": "mc_verb"}, questions, answered)],
                           image_tags, conditions, NO_BOOTSTRAP, token_models=["llava"])
    assert fov.acc_plain.tolist() == [1.0, 1.0]
    assert fov.conf_mean.isna().all() and rows.confidence.isna().all()


# ---- figures ---------------------------------------------------------------------------------------------


def test_roles_fall_back_when_there_is_no_instructblip():
    assert uncertainty_roles(["q", "l"], {"q": "qwen2_vl", "l": "llava"}) == {9: "l", 12: "q"}
    assert uncertainty_roles(["l"], {"l": "llava"}) == {9: "l", 12: "l"}
    assert uncertainty_roles(["l", "b"], {"l": "llava", "b": "instructblip"}) == {9: "l", 12: "b"}
    assert uncertainty_roles(["l", "b", "o"], {"l": "llava", "b": "instructblip", "o": "oracle"}, {9: "o"}) == {
        9: "o", 12: "b"}  # the config's choice first (analysis.uncertainty.figures)
    # the demo: Fig. 9 the oracle, so Fig. 12 (no instructblip; its role would be the oracle too) another model
    assert uncertainty_roles(["o", "l"], {"o": "oracle", "l": "llava"}, {9: "o"}) == {9: "o", 12: "l"}


def test_figures_are_written(tmp_path):
    obj = yn_questions("yn_obj", ["yes", "no", "no"])
    mc = mc_questions("mc_obj", {"g": ("img0", ["A", "B"])})
    keys = {"variant": "default", "condition": "clean"}
    runs = [({**keys, "model": "l", "qset": "yn_obj"}, obj, predictions(obj.question_id, ["yes", "yes", "no"],
                                                                        [0.9, 0.6, 0.7])),
            ({**keys, "model": "l", "qset": "mc_obj"}, mc, predictions(mc.question_id, ["A", "A"], [0.8, 0.4]))]
    hist, _ = uncertainty_tables(runs, UncertaintySettings(), NO_BOOTSTRAP)
    paths = {9: tmp_path / "fig9.png", 12: tmp_path / "fig12.png"}
    roles = draw_uncertainty_figures(hist, paths, ["l"], {"l": "llava", "prior": "prior"},
                                     notes={"l": "tiny model"}, skipped=["prior"])
    assert roles == {9: "l", 12: "l"}
    for path in paths.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image_tags, questions, answered = fov_fixture()
    conditions = {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.0}}
    fov, rows = fov_tables([({"model": "l", "variant": "default", "qset": "mc_verb"}, questions, answered)],
                           image_tags, conditions, NO_BOOTSTRAP, ["l"])
    draw_fov_figure(fov, rows, [tmp_path / "fig10a.png"], ["l"], ["mc_verb"], skipped=["prior"])
    assert (tmp_path / "fig10a.png").stat().st_size > 1000
    empty = tmp_path / "empty.png"
    draw_fov_figure(fov.iloc[:0], rows.iloc[:0], [empty], [], ["mc_verb"], skipped=["prior"])  # no model: a figure
    assert empty.stat().st_size > 1000


def test_each_figure_draws_the_variant_the_plan_gives_each_model_and_names_it(tmp_path, monkeypatch):
    """The run plan gives each model the variant its figures draw (its beam5 run where it has one): Figs. 9 and
    12 count that variant's rows only and name it in the heading, Fig. 10 in each panel's title."""
    import verbmirage.analysis.uncertainty_figures as figures

    saved = []
    monkeypatch.setattr(figures, "save_figure", lambda figure, path: saved.append(figure))
    obj = yn_questions("yn_obj", ["yes", "no", "no"])
    runs = [({"variant": variant, "condition": "clean", "model": "l", "qset": "yn_obj"}, obj,
             predictions(obj.question_id, answers, [0.9, 0.6, 0.7]))
            for variant, answers in (("default", ["yes", "yes", "yes"]), ("beam5", ["no", "no", "no"]))]
    hist, _ = uncertainty_tables(runs, UncertaintySettings(qsets=["yn_obj"]), NO_BOOTSTRAP)
    entries = {"default": {}, "beam5": {"decoding": "beam", "num_beams": 5, "paper_name": "beam5"}}
    draw_uncertainty_figures(hist, {9: tmp_path / "fig9.png"}, ["l"], {"l": "llava"}, variants={"l": "beam5"},
                             variant_entries=entries)
    (figure,) = saved
    assert "l, beam5, clean" in figure.get_suptitle()
    answered = {axis.get_title(): [t.get_text() for t in axis.get_legend().get_texts()]
                for axis in figure.axes if axis.get_legend()}
    assert answered == {"yn_obj, answered no": ["correct (n=2)", "hallucinated (n=1)"]}  # beam5's three "no"s
    image_tags, questions, answered_fov = fov_fixture()
    conditions = {"clean": {"type": "clean"}, "crop": {"type": "crop", "margin": 0.0}}
    fov, rows = fov_tables([({"model": "l", "variant": v, "qset": "mc_verb"}, questions, answered_fov)
                            for v in ("default", "beam5")], image_tags, conditions, NO_BOOTSTRAP, ["l"])
    draw_fov_figure(fov, rows, [tmp_path / "fig10a.png"], ["l"], ["mc_verb"], variants={"l": "default"},
                    variant_entries=entries)
    assert [axis.get_title() for axis in saved[-1].axes if axis.get_title()][0].startswith("l (default (greedy)), ")


# ---- the paper's numbers ----------------------------------------------------------------------------------

PAPER_TABLES = Path(__file__).resolve().parents[3] / "shared" / "data" / "paper_tables.csv"


@pytest.mark.skipif(not PAPER_TABLES.is_file(), reason="paper_tables.csv not present")
def test_the_paper_prints_no_number_for_figs_9_10_12():
    """The captions say the paper gives these as figures only: paper_tables.csv must agree."""
    paper = pd.read_csv(PAPER_TABLES)
    text = paper.fillna("").astype(str).agg(" ".join, axis=1).str.lower()
    assert not text.str.contains(r"crop|field of view|fov|uncertaint|confidence|fig(?:ure|\.)? ?(?:9|10|12)\b").any()
    assert not paper.condition.astype(str).str.startswith("crop").any()
