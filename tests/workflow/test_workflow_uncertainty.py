"""The demo's token-uncertainty and field-of-view outputs (rules uncertainty, uncertainty_figures, fov, fov_report)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from verbmirage.core.io import read_table
from verbmirage.core.schemas import FOV, FOV_ROWS, METRICS, PREDICTIONS, UNCERTAINTY_HIST

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n"


def _config(demo_run) -> dict:
    return yaml.safe_load((demo_run / "config.yaml").read_text())


#: The demo's logit-scored models (tiny_llava, its Nullu edit and its Pangea fine-tune); the blind baselines and CLIP
#: have no token probability.
TOKEN_MODELS = {"oracle", "tiny_llava", "tiny_llava_nullu", "tiny_llava_pangea"}  # with an answer confidence


def _predictions(demo_run, qset, condition, model, variant="default") -> pd.DataFrame:
    path = demo_run / f"results/predictions/hico/{qset}/{condition}/{model}/{variant}.parquet"
    return read_table(path, PREDICTIONS)


def test_histogram_counts_add_up_to_the_answered_rows(demo_run):
    hist = read_table(demo_run / "results/analysis/uncertainty_hist.parquet", UNCERTAINTY_HIST)
    settings = _config(demo_run)["analysis"]["uncertainty"]
    # only the logit-scored model; the blind baselines have no token probability
    assert set(hist.model) == TOKEN_MODELS
    assert set(hist.condition) == set(settings["conditions"]) == {"clean"}
    assert set(hist.qset) == {"yn_obj+yn_verb", "mc_obj", "mc_verb"}  # pool_yn
    assert set(hist.group) <= {"pred_yes", "pred_no", "pred_other", "mc"}
    assert len(set(zip(hist.bin_left, hist.bin_right))) == settings["bins"] == 20
    assert "default" in set(hist.variant)  # every variant a model runs has its histograms; count the default's
    answered = 0
    for qset, model in [(qset, model) for qset in settings["qsets"] for model in sorted(TOKEN_MODELS)]:
        frame = _predictions(demo_run, qset, "clean", model)
        assert frame.confidence[frame.error.isna()].notna().all()  # a token probability on every answered row
        answered += int(frame.error.isna().sum())
    assert int(hist["count"][hist.variant.eq("default")].sum()) == answered
    for _, series in hist.groupby(["model", "variant", "qset", "group", "correct"]):
        assert (series.density * (series.bin_right - series.bin_left)).sum() == pytest.approx(1.0)


def test_uncertainty_metric_rows_reach_the_metrics_table(demo_run):
    metrics = read_table(demo_run / "results/metrics/metrics.parquet", METRICS)
    ours = metrics.qset.isin(["yn_obj+yn_verb", "mc_obj", "mc_verb"]) & metrics.condition.eq("clean")
    rows = metrics[ours & metrics.metric.isin(["conf_mean", "conf_median", "conf_auroc", "n_dropped"])]
    assert set(rows.model) == TOKEN_MODELS  # the blind baselines have no token probability
    assert set(rows.metric) == {"conf_mean", "conf_median", "conf_auroc", "n_dropped"}
    means = rows[rows.metric.eq("conf_mean")]
    assert means.subset.str.fullmatch(r"(pred_yes|pred_no|pred_other|mc):(correct|hallucinated)").all()
    assert means.value.between(0, 1).all()
    dropped = rows[rows.metric.eq("n_dropped")]
    assert (dropped.value == 0).all()  # the demo's tiny model answers every question


def test_fov_compares_the_same_questions_under_every_condition(demo_run):
    fov = read_table(demo_run / "results/analysis/fov.parquet", FOV)
    rows = read_table(demo_run / "results/analysis/fov_rows.parquet", FOV_ROWS)
    config = _config(demo_run)
    settings = config["analysis"]["fov"]
    assert set(fov.condition) == set(settings["conditions"]) == {"clean", "crop"}
    assert set(fov.qset) == set(settings["qsets"])
    # accuracies for every model that answers the FOV sets (baselines included; the demo's CLIP answers others)
    answering = {m for m, entry in config["models"].items()
                 if set(settings["qsets"]) <= set(entry.get("qsets", settings["qsets"]))}
    assert set(fov.model) == answering and "always_yes" in answering
    for (model, variant, qset), part in rows.groupby(["model", "variant", "qset"]):
        ids = {c: set(part.question_id[part.condition == c]) for c in settings["conditions"]}
        assert ids["clean"] == ids["crop"], (model, qset)
        # the crop's questions are exactly those it was asked (single-instance images)
        assert ids["crop"] == set(_predictions(demo_run, qset, "crop", model, variant).question_id)
    for _, part in fov.groupby(["model", "variant", "qset"]):
        assert part.n.nunique() == 1 and part.n_groups.nunique() == 1
    clean, crop = fov[fov.condition == "clean"], fov[fov.condition == "crop"]
    assert (clean.crop_area_frac_mean == 1.0).all() and clean.delta_conf_mean.isna().all()
    assert (crop[crop.n > 0].crop_area_frac_mean < 1.0).all() and (crop.margin == 0.1).all()
    baselines = fov[~fov.model.isin(TOKEN_MODELS)]  # blind baselines and CLIP
    assert baselines.conf_mean.isna().all()  # no token probability: no confidence
    assert fov.conf_mean[fov.model.isin(TOKEN_MODELS)].notna().all()


def test_figures_and_fov_table_exist(demo_run):
    figures = demo_run / "results" / "figures"
    for name in ("fig9_uncertainty.png", "fig12_uncertainty.png", "fig10a_fov.png", "fig10b_fov.png"):
        assert (figures / name).read_bytes()[:8] == PNG, name
    table = pd.read_parquet(demo_run / "results/tables/fov.parquet")
    assert set(table.crop) == {"crop"} and {"plain_change", "circular_change", "conf_change"} <= set(table.columns)
    markdown = (demo_run / "results/tables/fov.md").read_text()
    assert "The paper gives Fig. 10 only" in markdown
    assert (demo_run / "results/tables/fov.html").is_file()
