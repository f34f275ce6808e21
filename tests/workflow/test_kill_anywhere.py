"""A run that survives being killed anywhere (docs/faults.md).

The demo, on a smaller config, is run once without interruption, then again while Snakemake and every job it
started are killed with SIGKILL at seeded moments spread over the run; each time the run is unlocked and
started again as the docs tell a user. The final tree must be byte-identical to the uninterrupted run's, with
no temporary file and no process left. ``tools/kill_anywhere.py`` does the same on the full demo.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from workflow_run import write_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import kill_anywhere  # noqa: E402  (tools/ is not a package)

pytestmark = pytest.mark.slow
KILLS = 3


#: The variants kept: plain, a decoding with VCD (two streams), a calibrated decision (its own GPU job), and the
#: paper's beam5 (the derived models' Table 5 rows).
KEPT_VARIANTS = ("default", "beam5", "sample_vcd", "calibrated")


def _small_demo(config: dict) -> None:
    """The demo without its costliest extras (CharadesEgo videos, attention with a second model family, the
    Known-Object study, most variants, the salt-and-pepper condition: crop is the image condition kept, the one
    on fewer questions; the answer-key and prior baselines and their ensemble: the coin-flip model keeps the
    sharded baseline jobs), on fewer images: every kind of job that keeps state across a kill stays (sharded
    and decoded inference with its parts, image conditions, the resumable fine-tune, Nullu, calibration,
    metrics, tables, figures)."""
    config["demo"].update(train_images=120, test_images=30)
    del config["conditions"]["saltpepper"]
    config["metrics"]["error_consistency"] = [pair for pair in config["metrics"]["error_consistency"]
                                              if "saltpepper" not in pair]
    del config["datasets"]["charadesego"]
    for analysis in ("attention", "known_object"):
        del config["analysis"][analysis]
    config["questions"]["sets"].remove("yn_ko")
    for model in ("tiny_clip", "always_yes", "prior", "oracle"):
        del config["models"][model]
    config["analysis"]["uncertainty"].pop("figures", None)  # the oracle drawn in Fig. 9 is gone
    config["ensembles"] = {}
    config["variants"] = {slug: entry for slug, entry in config["variants"].items() if slug in KEPT_VARIANTS}
    config["analysis"]["vcd_divergence"].pop("pairs", None)


def test_sigkill_anywhere_then_rerun_gives_the_uninterrupted_tree(tmp_path):
    reference, killed, logs = tmp_path / "reference", tmp_path / "killed", tmp_path / "logs"
    for folder in (reference, killed, logs):
        folder.mkdir()
    configfile = write_config(tmp_path, _small_demo)
    assert "charadesego" not in yaml.safe_load(configfile.read_text())["datasets"]
    kill_anywhere.run_to_end(kill_anywhere.snakemake_command(reference, configfile, 2), logs / "reference.log",
                             timeout=1200)
    report = kill_anywhere.interrupted_run(killed, configfile, KILLS, seed=0, cores=2, logs=logs, timeout=1200)
    report = kill_anywhere.check(reference, killed, report)
    assert len(report.kills) == KILLS, f"only {len(report.kills)} kills landed before the run finished"
    assert not report.differences, report.differences[:20]
    assert not report.leftovers and not report.orphans
    assert list((killed / "results").rglob("tables/table1.parquet"))  # the run did finish (its config's tree)
