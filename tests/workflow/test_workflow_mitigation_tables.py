"""The demo run's Tables 5 and 8 (rule mitigation_tables): files, the paper's rows, our rows for every run of a
Table 5/8 variant, and the Parquet tables equal the library run again on the demo's metrics table."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from verbmirage.models.derived import derived_entries
from verbmirage.core.io import read_table
from verbmirage.core.schemas import DECODING_TABLE8, METRICS, MITIGATION_TABLE5
from verbmirage.models.entries import stand_ins
from verbmirage.evaluation.mitigation_tables import PROMPT_SUFFIX_METHOD, TABLE8_DECODINGS, table5, table8
from verbmirage.evaluation.paper_methods import TABLE5_VARIANT_METHODS, paper_method_pairs, paper_methods_from_config
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers, paper_names_from_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(demo_run):
    config = yaml.safe_load((demo_run / "config.yaml").read_text())
    return {
        "dir": demo_run,
        "config": config,
        "metrics": read_table(demo_run / "results/metrics/metrics.parquet", METRICS),
        "names": {slug: entry.get("paper_name", "") for slug, entry in config["variants"].items()},
        "models": list(config["models"]) + list(config.get("ensembles") or {}),
    }


def _runs(metrics):
    clean = metrics[(metrics.dataset == "hico") & (metrics.subset == "all") & (metrics.condition == "clean")]
    return set(zip(clean.model, clean.variant))


@pytest.mark.parametrize("number", [5, 8])
def test_tables_5_and_8_are_written_with_the_papers_rows(run, number):
    schema = {5: MITIGATION_TABLE5, 8: DECODING_TABLE8}[number]
    for ext in ("parquet", "md", "html"):
        assert (run["dir"] / f"results/tables/table{number}.{ext}").stat().st_size > 0
    frame = read_table(run["dir"] / f"results/tables/table{number}.parquet", schema)
    paper = frame[frame.source == "paper"]
    # Table 5: 8 rows + Appendix F's prompt row and its Qwen2.5-VL-7B row; Table 8: 3 models x 3 decodings
    assert len(paper) == {5: 10, 8: 9}[number]
    markdown = (run["dir"] / f"results/tables/table{number}.md").read_text()
    assert f"## Table {number}:" in markdown and "nan" not in markdown
    assert "LLaVA-1.5-7B" in (run["dir"] / f"results/tables/table{number}.html").read_text()


def test_every_table8_run_has_its_row(run):
    frame = read_table(run["dir"] / "results/tables/table8.parquet", DECODING_TABLE8)
    ours = frame[frame.source == "measured"]
    expected = {(m, v) for m, v in _runs(run["metrics"]) if run["names"].get(v) in TABLE8_DECODINGS}
    assert set(zip(ours.model, ours.variant)) == expected
    assert all(ours.decoding == [run["names"][v] for v in ours.variant])
    clean = run["metrics"].set_index(["dataset", "qset", "condition", "model", "variant", "subset", "metric"])
    for row in ours.itertuples():
        value = clean.value.get(("hico", "yn_obj", "clean", row.model, row.variant, "all", "accuracy"))
        assert row.yn_obj_acc == pytest.approx(100 * value, nan_ok=True)


def test_table5_rows_of_the_demo(run):
    frame = read_table(run["dir"] / "results/tables/table5.parquet", MITIGATION_TABLE5)
    ours = frame[frame.source == "measured"]
    mitigations = {v for v, name in run["names"].items() if name in ("VCD", "OPERA", PROMPT_SUFFIX_METHOD)}
    ran_mitigation = {m for m, v in _runs(run["metrics"]) if v in mitigations}
    # every Table 5 variant of a model that ran a mitigation has its row, named by the paper's method
    for model, variant in _runs(run["metrics"]):
        name = run["names"].get(variant)
        if model in ran_mitigation and (name in TABLE5_VARIANT_METHODS or name == PROMPT_SUFFIX_METHOD):
            row = ours[(ours.model == model) & (ours.variant == variant)]
            assert row.method.tolist() == [TABLE5_VARIANT_METHODS.get(name, name)]
    assert set(ours.model) <= ran_mitigation | set(paper_methods_from_config(run["config"], derived_entries(run["config"])))
    # the demo's derived models stand on a random-weight base with no paper_name: no difference is printed
    shown = (run["dir"] / "results/tables/table5.md").read_text()
    assert "Δ" not in shown


@pytest.mark.parametrize("number", [5, 8])
def test_tables_equal_the_library_on_the_demo_metrics(run, number):
    """The rule's params reach the library: rebuilding from the demo's metrics gives the same Parquet rows."""
    paper = load_paper_numbers(packaged_paper_numbers())
    names = paper_names_from_config(run["config"])
    if number == 5:
        derived = derived_entries(run["config"])
        methods = paper_methods_from_config(run["config"], derived)
        assert methods["tiny_llava_pangea"].startswith("Pangea-LoRA (variant of the paper's method: Yes:No 1:2")
        expected = table5(run["metrics"], paper, run["models"], run["names"], names, methods,
                          method_pairs=paper_method_pairs(run["config"], methods, derived),
                          stand_ins=stand_ins(run["config"])).frame
    else:
        expected = table8(run["metrics"], paper, run["models"], run["names"], names,
                          stand_ins=stand_ins(run["config"])).frame
    assert expected.note.str.contains("stand-in, not a model's result (random weights)", regex=False).any()
    schema = {5: MITIGATION_TABLE5, 8: DECODING_TABLE8}[number]
    written = read_table(run["dir"] / f"results/tables/table{number}.parquet", schema)
    pd.testing.assert_frame_equal(written.reset_index(drop=True), expected[schema.names].reset_index(drop=True),
                                  check_dtype=False)
