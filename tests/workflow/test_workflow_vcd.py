"""The demo's VCD divergence outputs (rule vcd_divergence), and its planning with and without a VCD variant."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from verbmirage.analysis.vcd_divergence_settings import plain_counterparts, vcd_divergence_settings, vcd_variants
from verbmirage.models.derived import effective_models
from verbmirage.core.io import read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS, VCD_DIVERGENCE, VCD_KL_HIST
from verbmirage.models.registry import variant_features
from verbmirage.variants.settings import model_variants

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n"
OUTPUTS = ["results/analysis/vcd_divergence.parquet", "results/analysis/vcd_divergence.html",
           "results/analysis/vcd_kl_hist.parquet", "results/figures/vcd_divergence.png"]


def _config(demo_run) -> dict:
    return yaml.safe_load((demo_run / "config.yaml").read_text())


def _vcd_runs(config: dict) -> dict[str, list[str]]:
    """model -> the VCD variants it runs in this config (the workflow's own planning rule)."""
    vcd = set(vcd_variants(config))
    runs = {slug: [v for v in model_variants(config, slug, variant_features(entry["backend"])) if v in vcd]
            for slug, entry in effective_models(config).items()}  # derived entries: their base's backend
    return {slug: variants for slug, variants in runs.items() if variants}


@pytest.fixture(scope="module")
def vcd_demo(request):
    """The demo run, once its config runs a VCD variant (checked on config.yaml first: no demo run to skip)."""
    from workflow_run import REPO

    message = "the demo config runs no VCD variant (variants.<slug>.vcd): nothing to check"
    if not _vcd_runs(yaml.safe_load((REPO / "config.yaml").read_text())):
        pytest.skip(message)
    demo_run = request.getfixturevalue("demo_run")
    config = _config(demo_run)
    if not _vcd_runs(config):
        pytest.skip(message)
    return demo_run, config


def _predictions(demo_run, qset, condition, model, variant) -> pd.DataFrame:
    return read_table(demo_run / f"results/predictions/hico/{qset}/{condition}/{model}/{variant}.parquet",
                      PREDICTIONS)


def test_vcd_divergence_table_and_figure_exist(vcd_demo):
    demo_run, config = vcd_demo
    for path in OUTPUTS:
        assert (demo_run / path).is_file(), path
    assert (demo_run / "results/figures/vcd_divergence.png").read_bytes()[:8] == PNG
    summary = read_table(demo_run / OUTPUTS[0], VCD_DIVERGENCE)
    runs = _vcd_runs(config)
    assert set(zip(summary.model, summary.variant)) == {(m, v) for m, variants in runs.items() for v in variants}
    assert set(summary.condition) <= set(vcd_divergence_settings(config).conditions)
    assert summary.share_kl_zero.between(0, 1).all() and (summary.n > 0).all()
    pooled = summary[summary.qset.str.contains(r"\+")]
    assert pooled.paper_share_kl_zero.eq(0.93).all() and pooled.paper_n.eq(20000).all()


def test_vcd_divergence_counts_equal_the_prediction_tables(vcd_demo):
    demo_run, config = vcd_demo
    summary = read_table(demo_run / OUTPUTS[0], VCD_DIVERGENCE)
    counterparts = plain_counterparts(config, vcd_divergence_settings(config).pairs)
    per_set = summary[~summary.qset.str.contains(r"\+")]
    assert len(per_set)
    for row in per_set.itertuples():
        vcd = _predictions(demo_run, row.qset, row.condition, row.model, row.variant)
        answered = vcd[vcd.error.isna()]
        assert answered.vcd_kl.notna().all() and answered.vcd_plausible.notna().all()  # the engine stores both
        assert (answered.vcd_kl >= 0).all() and (answered.vcd_plausible >= 1).all()
        assert row.n == len(answered) and row.n + row.n_dropped == len(vcd)
        assert row.n_kl_zero == int((answered.vcd_kl == 0).sum())
        assert row.n_plausible_one == int((answered.vcd_plausible == 1).sum())
        assert (answered.vcd_kl[answered.vcd_plausible == 1] == 0).all()  # one token left: KL 0 by construction
        plain_variant = counterparts[row.variant]
        if row.model in _runs_plain(config, plain_variant):
            assert row.plain_variant == plain_variant
            plain = _predictions(demo_run, row.qset, row.condition, row.model, plain_variant)
            both = answered.merge(plain[plain.error.isna()], on="question_id", suffixes=("", "_plain"))
            assert row.n_paired == len(both)
            assert row.n_flips == int((both.prediction != both.prediction_plain).sum())
        else:
            assert pd.isna(row.n_flips) and row.plain_note


def _runs_plain(config: dict, plain_variant: str | None) -> set[str]:
    if plain_variant is None:
        return set()
    return {slug for slug, entry in effective_models(config).items()
            if plain_variant in model_variants(config, slug, variant_features(entry["backend"]))}


def test_vcd_kl_histogram_adds_up(vcd_demo):
    demo_run, config = vcd_demo
    summary = read_table(demo_run / OUTPUTS[0], VCD_DIVERGENCE)
    hist = read_table(demo_run / OUTPUTS[2], VCD_KL_HIST)
    questions = {q: read_table(demo_run / f"results/benchmark/hico/{q}.parquet", QUESTIONS) for q in config["questions"]["sets"]}
    assert questions  # the question tables the flips were checked against exist
    for row in summary.itertuples():
        part = hist[(hist.model == row.model) & (hist.variant == row.variant) & (hist.condition == row.condition)
                    & (hist.qset == row.qset)]
        assert int(part["count"].sum()) == row.n
        zero = part[part.bin_right == 0]
        assert len(zero) == 1 and int(zero["count"].iloc[0]) == row.n_kl_zero
        assert part.share.sum() == pytest.approx(1.0)


# ---- re-planning the finished demo (a dry run; what a config with or without VCD plans: tests/fast/test_plan.py) ---


def test_a_models_own_vcd_settings_rerun_only_its_runs_of_that_variant(demo_run):
    """models.<slug>.variant_settings go with that model's runs of that variant only (their params and resume
    fingerprint): tiny_llava's sample_vcd at alpha 0.5 (InstructBLIP's official value) asks that run again and
    no other model's or variant's."""
    from workflow_run import planned_jobs, write_config

    write_config(demo_run, lambda config: config["models"]["tiny_llava"].update(
        variant_settings={"sample_vcd": {"vcd": {"alpha": 0.5}}}))
    try:
        jobs = planned_jobs(demo_run)
    finally:
        write_config(demo_run)
    assert {(w["model"], w["variant"]) for rule, w in jobs if rule == "predict_suite"} == {("tiny_llava", "sample_vcd")}
