"""Object reliance in the demo run: Tables 6 and 7 with our rows and the paper's, Fig. 15, the metric rows."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from verbmirage.analysis.object_reliance import IOU_METRIC, OVERLAP_METRIC, PAPER_TABLE6, PAPER_TABLE7, object_reliance
from verbmirage.analysis.object_reliance_settings import RELIANCE_QSETS, reliance_plan
from verbmirage.data.hico import load_hico
from verbmirage.core.io import read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import (
    METRICS,
    OBJECT_RELIANCE,
    PREDICTIONS,
    RELIANCE_TABLE6,
    RELIANCE_TABLE7,
    VERB_INFLUENCE,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reliance(demo_run):
    config = yaml.safe_load((demo_run / "config.yaml").read_text())
    plan = reliance_plan(config)
    assert plan is not None, "the demo config has analysis.object_reliance"
    metrics = read_table(demo_run / "results/metrics/metrics.parquet", METRICS)
    return config, plan, metrics


def test_outputs_exist(demo_run, reliance):
    for path in ["results/analysis/object_reliance.parquet", "results/analysis/verb_influence.parquet",
                 "results/figures/fig15_object_reliance.png",
                 *(f"results/tables/table{n}.{ext}" for n in (6, 7) for ext in ("parquet", "md", "html"))]:
        assert (demo_run / path).stat().st_size > 0, path


def test_table6_has_our_rows_and_the_papers_and_equals_the_metric_rows(demo_run, reliance):
    _, plan, metrics = reliance
    table = read_table(demo_run / "results/tables/table6.parquet", RELIANCE_TABLE6)
    ours = table[table.source == "measured"].set_index("model")
    assert list(ours.index) == plan["models"]
    assert table[table.source == "paper"].set_index("model").overlap_index.to_dict() == PAPER_TABLE6
    rows = metrics[(metrics.metric == OVERLAP_METRIC) & (metrics.qset == "yn+mc")].set_index("model")
    assert sorted(rows.index) == sorted(plan["models"])
    for model in plan["models"]:
        assert ours.loc[model, "overlap_index"] == pytest.approx(100 * rows.loc[model, "value"], nan_ok=True)
        assert rows.loc[model, "n"] == min(ours.loc[model, "s1"], ours.loc[model, "s2"])
    markdown = (demo_run / "results/tables/table6.md").read_text()
    assert "Qwen-VL-Chat" in markdown and plan["models"][0] in markdown and "95.35" in markdown


def test_table7_has_every_pair_and_the_papers_and_equals_the_metric_rows(demo_run, reliance):
    _, plan, metrics = reliance
    table = read_table(demo_run / "results/tables/table7.parquet", RELIANCE_TABLE7)
    ours = table[table.source == "measured"]
    models = plan["models"]
    expected = [(a, b) for i, a in enumerate(models) for b in models[i + 1:]]
    assert list(zip(ours.model_a, ours.model_b)) == expected
    paper = table[table.source == "paper"]
    assert dict(zip(zip(paper.model_a, paper.model_b), paper.iou)) == PAPER_TABLE7
    rows = metrics[(metrics.metric == IOU_METRIC) & (metrics.qset == "yn")].set_index("model")
    for a, b, iou, either in zip(ours.model_a, ours.model_b, ours.iou, ours.w_a_or_w_b):
        assert iou == pytest.approx(100 * rows.loc[f"{a}~{b}", "value"], nan_ok=True)
        assert rows.loc[f"{a}~{b}", "n"] == either
    html = (demo_run / "results/tables/table7.html").read_text()
    assert html.count("<table") == 3 and "59.30" in html  # pairs, our matrix, the paper's matrix


def test_metric_rows_equal_an_independent_run_of_the_analysis(demo_run, reliance):
    """The workflow read the right files: the library run on the demo's questions and answers gives the same."""
    config, plan, metrics = reliance
    keys = {"dataset": "hico", "condition": plan["condition"], "variant": plan["variant"]}
    questions = {q: read_table(demo_run / f"results/benchmark/hico/{q}.parquet", QUESTIONS) for q in RELIANCE_QSETS}
    predictions = {
        (m, q): read_table(demo_run / f"results/predictions/hico/{q}/{plan['condition']}/{m}/{plan['variant']}.parquet",
                           PREDICTIONS)
        for m in plan["models"] for q in RELIANCE_QSETS
    }
    anno = load_hico(demo_run / config["datasets"]["hico"]["root"])
    objects, verbs, rows = object_reliance(questions, predictions, anno, plan["models"], plan["settings"], keys)
    pd.testing.assert_frame_equal(
        read_table(demo_run / "results/analysis/object_reliance.parquet", OBJECT_RELIANCE), objects,
        check_dtype=False)
    pd.testing.assert_frame_equal(
        read_table(demo_run / "results/analysis/verb_influence.parquet", VERB_INFLUENCE), verbs, check_dtype=False)
    stored = metrics[metrics.metric.isin([OVERLAP_METRIC, IOU_METRIC])].set_index(["metric", "model"]).sort_index()
    mine = rows.set_index(["metric", "model"]).sort_index()
    assert stored.value.to_numpy() == pytest.approx(mine.value.to_numpy(), nan_ok=True)
    assert stored.n.tolist() == mine.n.tolist()
    assert (objects.n_obj > 0).any() and (verbs.n_verb > 0).any()  # the demo attributes questions to objects
