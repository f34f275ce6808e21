"""bench/projection.py: the paper config's prompts per decoding and the projected run times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import projection  # noqa: E402  (bench/ is not a package)


def test_each_variant_maps_to_the_decoding_that_was_timed():
    assert projection.decoding_of({}) == "greedy"
    assert projection.decoding_of({"prompt_suffix": "x"}) == "greedy"
    assert projection.decoding_of({"decoding": "beam", "num_beams": 5}) == "beam5"
    assert projection.decoding_of({"decoding": "sample", "vcd": {}}) == "vcd_sample"
    assert projection.decoding_of({"vcd": {"alpha": 1.0}}) == "vcd_greedy"
    assert projection.decoding_of({"decoding": "opera", "num_beams": 5}) == "opera"


def test_the_paper_config_mix_counts_its_engine_models_runs():
    mix = projection.paper_mix()
    assert mix["engine_models"] == ["instructblip_7b", "llava15_7b", "llava15_7b_nullu", "llava15_7b_pangea",
                                    "qwen2_5_vl_7b", "qwen2_vl_7b"]
    assert mix["remote_models"] == ["minicpm_llama3_v25", "molmo_7b_d", "mplug_owl2", "qwen_vl_chat"]
    assert {"gpt4_turbo", "prior", "clip_l14"} <= set(mix["left_out"]) and "molmo_7b_d" not in mix["left_out"]
    assert mix["remote_prompts"]["greedy"] > 0  # the remote-code models' runs count too
    # LLaVA-1.5-7B's OPERA run (Table 8) asks the four verb sets, on clean images only
    assert mix["prompts"]["opera"] == sum(projection.HICO_PROMPTS[q] for q in ("yn_obj", "yn_verb", "mc_obj", "mc_verb"))
    assert mix["prompts"]["greedy"] > mix["prompts"]["opera"] and mix["prompts"]["vcd_greedy"] == 0
    assert "hico/yn_ko" in mix["not_counted"]


def test_projection_divides_each_decodings_prompts_by_its_rate():
    mix = {"config": "configs/x.yaml", "prompts": {"greedy": 36_000, "beam5": 7_200, "opera": 0},
           "engine_models": ["a"], "left_out": ["b"], "not_counted": []}
    lines = projection.projection_lines(10.0, {"greedy": 1.0, "beam5": 5.0}, mix)
    suite = sum(projection.HICO_PROMPTS.values())
    assert lines[1] == f"  whole HICO suite, greedy: {suite:,} prompts in {suite / 10 / 60:.1f} min"
    assert "43,200 prompts in 2.0 h" in lines[2]  # 36,000 / 10 / 3600 = 1 h, 7,200 x 5 / 10 / 3600 = 1 h
    assert lines[3] == "    greedy 36,000 prompts 1.00 h, beam5 7,200 prompts 1.00 h"
    assert lines[-2] == "  whole config, every GPU model: 2.0 GPU-hours (target <= 10)"
    remote = {**mix, "remote_prompts": {"greedy": 36_000, "beam5": 0}, "remote_models": ["r"],
              "remote_runs": {"r": {"backend": "mplug_owl2", "prompts": {"greedy": 36_000}}}}
    lines = projection.projection_lines(10.0, {"greedy": 1.0, "beam5": 5.0}, remote, generate_rate=1.0)
    own = 36_000 / projection.remote_rates("mplug_owl2", {})["greedy"] / 3600
    assert f"  its 1 remote-code models (r): 36,000 prompts in {own:.1f} h at their own rates, 1.0 h at the " \
        "engine's rates (batched like the engine), 10.0 h one question at a time (generate at batch 1, 1.00 " \
        "prompts/s)" in lines
    assert lines[-2] == f"  whole config, every GPU model: {2 + own:.1f} GPU-hours (target <= 10)"
    assert "no prompt mix" in projection.projection_lines(10.0, {}, None)[-1]
    with pytest.raises(KeyError):
        projection.projection_lines(10.0, {}, {"prompts": {}})


def test_the_remote_code_models_are_projected_at_their_own_rates():
    """Each remote-code model's runs count at its rate: greedy at the one-at-a-time rate times its batching
    speed-up, beam5 that divided by beam5's cost, sampling one question at a time."""
    mix = projection.paper_mix()
    remote = mix["remote_runs"]
    assert sorted(remote) == mix["remote_models"] and set(remote) == {"qwen_vl_chat", "molmo_7b_d", "minicpm_llama3_v25", "mplug_owl2"}
    assert remote["molmo_7b_d"] == {"backend": "molmo", "prompts": {"greedy": 503_804}}  # no beams: greedy only
    assert set(remote["qwen_vl_chat"]["prompts"]) == {"greedy", "beam5", "sample"}
    rates = projection.remote_rates("mplug_owl2", {"beam5": 2.0})
    speedup = projection.REMOTE_SCORING_SPEEDUP["mplug_owl2"]
    assert rates["greedy"] == pytest.approx(projection.ONE_AT_A_TIME_RATE * speedup)
    assert rates["beam5"] == pytest.approx(rates["greedy"] / 2) and rates["sample"] == projection.ONE_AT_A_TIME_RATE
    small = {"config": "configs/x.yaml", "prompts": {"greedy": 36_000}, "engine_models": ["a"], "left_out": [],
             "not_counted": [], "remote_models": ["m"], "remote_prompts": {"greedy": 36_000},
             "remote_runs": {"m": {"backend": "mplug_owl2", "prompts": {"greedy": 36_000}}}}
    lines = projection.projection_lines(10.0, {"greedy": 1.0}, small)
    hours = 36_000 / rates["greedy"] / 3600
    assert f"greedy 36,000 prompts {hours:.2f} h" in lines[4]
    assert lines[-2] == f"  whole config, every GPU model: {1 + hours:.1f} GPU-hours (target <= 10)"
