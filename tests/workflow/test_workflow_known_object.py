"""Known-Object mAP in the demo run: the AP table, the mAP rows of the long table and Fig. 11."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from known_object_reference import reference_ap_table

from verbmirage.analysis.known_object import hico_det_rare
from verbmirage.core.io import read_provenance, read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import KNOWN_OBJECT_AP, METRICS, PREDICTIONS
from verbmirage.models.registry import variant_features
from verbmirage.variants.settings import Variant, model_variants

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def known_object(demo_run):
    config = yaml.safe_load((demo_run / "config.yaml").read_text())
    settings = config["analysis"]["known_object"]
    questions = read_table(demo_run / f"results/benchmark/hico/{settings['qset']}.parquet", QUESTIONS)
    ap = read_table(demo_run / "results/metrics/ap_per_hoi.parquet", KNOWN_OBJECT_AP)
    return config, settings, questions, ap


def _predictions(demo_run, settings, condition, model, variant):
    path = f"results/predictions/hico/{settings['qset']}/{condition}/{model}/{variant}.parquet"
    return read_table(demo_run / path, PREDICTIONS)


def test_ap_table_has_one_row_per_run_and_asked_hoi(known_object):
    config, settings, questions, ap = known_object
    assert list(ap.columns) == KNOWN_OBJECT_AP.names
    # every run the plan makes: the variants each model's backend runs that ask the set under the condition
    runs = {(c, m, v) for c in settings["conditions"] for m in settings["models"]
            for v in model_variants(config, m, variant_features(config["models"][m]["backend"]))
            if Variant.from_config(config["variants"][v]).runs_under(c, "hico")
            and Variant.from_config(config["variants"][v]).asks(settings["qset"])}
    assert ("clean", "tiny_llava", "default") in runs
    asked = set(questions.hoi_id.astype(int))
    expected = {(c, m, v, h) for c, m, v in runs for h in asked}
    assert set(zip(ap.condition, ap.model, ap.variant, ap.hoi_id)) == expected and len(ap) == len(expected)


def test_ap_table_equals_an_independent_computation(demo_run, known_object):
    config, settings, questions, ap = known_object
    for (condition, model, variant), rows in ap.groupby(["condition", "model", "variant"]):
        predictions = _predictions(demo_run, settings, condition, model, variant)
        expected = reference_ap_table(questions, predictions).set_index("hoi_id")
        mine = rows.set_index("hoi_id").loc[expected.index]
        assert mine.n.tolist() == expected.n.tolist() and mine.n_pos.tolist() == expected.n_pos.tolist()
        defined = expected.n_pos > 0
        assert mine.ap[defined].to_numpy() == pytest.approx(expected.ap[defined].to_numpy(), abs=1e-12)
        assert mine.ap_voc11[defined].to_numpy() == pytest.approx(expected.ap_voc11[defined].to_numpy(), abs=1e-12)
    # the demo configures HICO-DET boxes: rare is HICO-DET's rule (< 10 training pairs), not the questions' flag
    rare, definition = hico_det_rare(demo_run / config["datasets"]["hico"]["det_root"])
    assert ap.rare.tolist() == [h in rare for h in ap.hoi_id]
    assert read_provenance(demo_run / "results/metrics/ap_per_hoi.parquet")["rare_definition"] == definition


def test_tiny_models_rank_by_their_margin(demo_run, known_object):
    _, settings, _, _ = known_object
    for model in ("tiny_llava", "tiny_clip"):
        predictions = _predictions(demo_run, settings, "clean", model, "default")
        margin = predictions.yes_margin.to_numpy(dtype=float)
        assert np.isfinite(margin).all()
        assert 1 / (1 + np.exp(-margin)) == pytest.approx(predictions.p_yes.to_numpy(dtype=float), abs=1e-6)


def test_map_rows_are_in_the_long_table(demo_run, known_object):
    _, settings, _, ap = known_object
    metrics = read_table(demo_run / "results/metrics/metrics.parquet", METRICS)
    rows = metrics[metrics.qset.eq(settings["qset"]) & metrics.metric.isin(["map", "map_voc11"])]
    assert set(rows.model) == set(settings["models"]) and set(rows.condition) == set(settings["conditions"])
    assert "all" in set(rows.subset) and set(rows.subset) <= {"all", "rare", "non_rare"}
    for (condition, model, variant), run in ap.groupby(["condition", "model", "variant"]):
        defined = run[run.n_pos > 0]
        mine = rows[rows.condition.eq(condition) & rows.model.eq(model) & rows.variant.eq(variant)]
        value = mine[mine.subset.eq("all")].set_index("metric")
        assert value.at["map", "value"] == pytest.approx(defined.ap.mean())
        assert value.at["map_voc11", "value"] == pytest.approx(defined.ap_voc11.mean())
        assert value.at["map", "n"] == len(defined)
        for subset, chosen in (("rare", defined[defined.rare]), ("non_rare", defined[~defined.rare])):
            part = mine[mine.subset.eq(subset)].set_index("metric")
            if len(chosen):
                assert part.at["map", "value"] == pytest.approx(chosen.ap.mean()) and part.at["map", "n"] == len(chosen)
            else:
                assert part.empty
        low, high = value.at["map", "ci_low"], value.at["map", "ci_high"]
        assert not math.isnan(low) and low <= high  # percentile interval of 200 image resamples


def test_fig11_is_drawn(demo_run):
    figure = demo_run / "results/figures/fig11_known_object_ap.png"
    assert figure.is_file() and figure.stat().st_size > 10_000
