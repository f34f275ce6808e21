"""The benchmark scripts run and print their figures (speed itself is not asserted: see bench/)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_cpu_benchmark_prints_both_regimes_and_each_decodings_cost():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_scoring.py"), "--images", "1",
                          "--max-new-tokens", "2", "--repeats", "1"], capture_output=True, text=True, timeout=600, check=True).stdout
    random, decisive = out.split("random model (as built):")[1].split("decisive model (output layer biased to yes/no):")
    shares = []
    for regime in (random, decisive):
        assert re.search(r"ratio engine / generate:\s+[\d.]+x", regime)
        assert float(re.search(r"max \|P\(yes\) difference\|:\s+([\d.e+-]+)", regime).group(1)) < 1e-4
        shares.append(float(re.search(r"answers continued past the first token:\s+([\d.]+)%", regime).group(1)))
    assert shares[1] <= 5.0 < shares[0]  # the decisive model's first token decides (almost) every answer
    costs = dict(re.findall(r"^  (\w+) +[\d.]+ prompts/s +([\d.]+)x greedy", out, re.M))
    assert list(costs) == ["greedy", "beam5", "sample", "vcd_greedy", "vcd_sample", "vcd_beam5", "opera"]
    assert float(costs["greedy"]) == 1.0 and all(float(cost) > 0 for cost in costs.values())
    assert re.search(r"peak memory:\s+\d+ MiB", out)
    # (a ratio of two timed passes may fall below 1 on a loaded machine: the continuation share then reads negative)
    targets = re.findall(r"^  (.+?) +(-?[\d.]+)  \((at least|at most) ([\d.]+): (met|missed)\)$", out, re.M)
    assert [what for what, *_ in targets][::3] == ["random: engine / generate", "beam-5 / greedy",
                                                  "VCD beam-5 / beam-5"] and len(targets) == 8
    for _, value, bound, target, verdict in targets:  # each verdict follows from its figure
        held = float(value) >= float(target) if bound == "at least" else float(value) <= float(target)
        assert verdict == ("met" if held else "missed")


def test_the_device_check_runs_every_step_in_smoke_mode(tmp_path):
    """bench/h200_check.sh, the one prepared device run: versions, engine vs generate, the suite benchmark at batch
    64 and at the sized batch, the profiled pass, each decoding and the projected run times of every GPU model,
    the GPU tests, a remote-code model batched vs one at a time; each also in $OUT (here on a CPU with --smoke: the
    benchmarks' narrow model, a few prompts, Molmo's tiny model in its worker env; the paper config's prompt mix
    written as bench/h200_wheels.sh writes it)."""
    sys.path.insert(0, str(REPO / "tests"))
    from remote_tiny import CODE_FOLDERS, REMOTE_CODE, envs_dir

    # without Molmo's worker env (or its code) the step says so and the check goes on; CI requires the envs
    molmo = (envs_dir() / "remote-molmo" / "bin" / "python").exists() and (REMOTE_CODE / CODE_FOLDERS["molmo"]).is_dir()
    assert molmo or os.environ.get("VERBMIRAGE_REQUIRE_REMOTE_ENVS") != "1", "Molmo's worker env is required here"
    mix = tmp_path / "paper_mix.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "projection.py"), "--write", str(mix)], check=True,
                   timeout=300)
    # the device has no pytest settings of ours: this run's own (CI's PYTEST_ADDOPTS, xdist's) stay out of its
    # GPU-test step, whose summary line a second -q would drop
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHON": sys.executable,
           "OUT": str(tmp_path)}
    out = subprocess.run(["bash", str(REPO / "bench" / "h200_check.sh"), "--smoke", "--mix",
                          str(mix)], env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    assert re.search(r"torch [\w.+]+ \| transformers [\w.]+ \| cuda (True|False)", out)
    # printed even as "none" (the CPU smoke needs no compiler); on CUDA, without one, nothing compiles
    assert re.search(r"^C compiler for Triton: (/\S+|none( \(CC=.* not found\))?)$", out, re.M)
    generate = (tmp_path / "generate.txt").read_text()
    assert re.search(r"^float32 random: the engine's first call [\d.]+ s$", generate, re.M)  # the compiler's wait
    steps = ["generate", "flips", "suite", "profile", "decodings", "gpu_tests"] + (["remote"] if molmo else [])
    assert re.findall(r"^== (\w+) took \d+ s$", out, re.M) == steps  # each step's time, every step run
    assert len(re.findall(r"^float32 (random|decisive): generate b1 [\d.]+ prompts/s .* ratio [\d.]+x .* decisions "
                          r"agree \d+/\d+$", generate, re.M)) == 2
    suite = (tmp_path / "suite.txt").read_text()
    assert re.search(r"suite ratio \(b / a\):\s+[\d.]+x", suite)
    flips = (tmp_path / "flips.txt").read_text()
    sized = re.search(r"sized: batch (\d+), \d+ questions per call \(1.0 GiB free of 2.0 GiB \(a fake reading\)", flips)
    assert sized, flips  # the suite step scores at the batch the sizing step chose
    assert re.search(rf"\(b\) at the sized batch {sized[1]}: +[\d.]+ prompts/s .*decisions differing from batch 64: "
                     r"\d+ of 12", suite)
    costs = re.findall(r"^\(b\) at batch \d+, forward cost +(\d+): +[\d.]+ prompts/s \(([\d.]+) positions per "
                       r"prompt; 6 prompts\)$", suite, re.M)
    assert [cost for cost, _ in costs] == ["256", "512"]  # the CPU's cost first, then the one asked for
    assert re.search(r"decisions differing between forward costs 256 and 512: \d+ of 6", suite)
    assert re.search(r"GPU busy \d+%; [\d.]+ kernels per prompt", (tmp_path / "profile.txt").read_text())
    decodings = (tmp_path / "decodings.txt").read_text()
    assert re.search(r"whole suite, greedy \(\d+ prompts of 5 sets on 1 images\):\s+[\d.]+ prompts/s", decodings)
    found = re.findall(r"^  (\w+) +batch +(\d+) \(calls of +(\d+)\) +[\d.]+ prompts/s +[\d.]+x greedy +"
                       r"arithmetic +([\d.]+)x", decodings, re.M)
    assert len(found) == 7
    arithmetic = {name: float(ratio) for name, _, _, ratio in found}  # beside the time: what each computed
    assert arithmetic["greedy"] == 1.0 < arithmetic["beam5"] and 1.9 <= arithmetic["vcd_greedy"] <= 2.1
    rows = {name: calls for name, _, calls, _ in found} | {f"{name}_batch": batch for name, batch, _, _ in found}
    # each decoding at the batch its job uses, set after its variant: on LLaVA every call holds four batches
    assert int(rows["greedy"]) == 4 * int(rows["greedy_batch"]) and int(rows["beam5"]) == 4 * int(rows["beam5_batch"])
    assert re.search(r"whole HICO suite, greedy: 223,618 prompts in [\d.]+ min", decodings)
    assert re.search(r"configs/paper.yaml, its \d+ transformers-engine models .*: [\d,]+ prompts in [\d.]+ h",
                     decodings)
    for model in ("random (as built)", "decisive"):
        assert re.search(rf"{re.escape(model)}: batch 64 +[\d.]+ prompts/s, batch \d+ +[\d.]+ prompts/s", flips)
    assert len(re.findall(r"answers that differ \(prediction\): +\d+ of \d+ \([\d.]+%; YN \d+ of \d+, MC \d+ of \d+\)",
                          flips)) == 2
    assert len(re.findall(r"max \|score difference\|: +[\d.e+-]+$", flips, re.M)) == 2
    assert re.search(r"its 4 remote-code models .*, [\d.]+ h one question at a time \(generate at batch 1", decodings)
    assert re.search(r"whole config, every GPU model: [\d.]+ GPU-hours", decodings)
    assert re.search(r"\d+ skipped", (tmp_path / "gpu_tests.txt").read_text())  # no CUDA here: gpu tests skip
    if not molmo:
        assert "== remote skipped: Molmo-7B-D's worker env or code is absent" in out
        return
    remote = (tmp_path / "remote.txt").read_text()
    # batched: one image prefix per image, no one-question fallback; its logits equal one at a time's
    row = re.search(r"^molmo +tiny \(smoke\) +6 +([\d.]+) +([\d.]+) +([\d.]+)x +([\d.e+-]+)$", remote, re.M)
    assert remote.startswith("cpu, float32\n") and row and float(row[3]) > 0 and float(row[4]) < 1e-5, remote
    assert '"forwards": {"prefix": 2' in remote and '"single": 0}' in remote
    # the image's crops made once per image in batches (2 images), once per question alone (2 timed)
    assert '"image_preprocessing": {"alone": 2, "batched": 2}' in remote


def test_suite_benchmark_prints_both_rates_and_the_suite_ratio_per_call_size():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "suite_scoring.py"), "--images", "1", "--repeats", "1",
                          "--batch-size", "8", "64"], capture_output=True, text=True, timeout=600, check=True).stdout
    reports = out.split(" prompts of 5 sets on 1 images")[1:]
    assert len(reports) == 2
    for size, text in zip((8, 64), reports):
        assert f", batch {size}, {4 * size} questions per call)" in text  # a greedy LLaVA call: 4 batches
        rates = [float(x) for x in re.findall(r"\(\w\) [\w ]+:\s+([\d.]+) prompts/s", text)]
        assert len(rates) == 2 and all(rate > 0 for rate in rates)
        ratio = float(re.search(r"suite ratio \(b / a\):\s+([\d.]+)x", text).group(1))
        assert ratio == pytest.approx(rates[1] / rates[0], rel=0.01)  # one pair: its ratio is the rates' ratio
        assert float(re.search(r"max \|score difference\|:\s+([\d.e+-]+)", text).group(1)) < 1e-4
        assert re.search(r"peak memory:\s+\d+ MiB", text)


def test_question_set_benchmark_prints_each_set_and_the_total(demo_roots):
    out = subprocess.run([sys.executable, str(REPO / "bench" / "question_sets.py"), str(demo_roots[0]), "--baseline"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert re.search(r"load anno.mat:\s+[\d.]+ s", out)
    assert len(re.findall(r"^\s+\w+\s+alone:\s+[\d.]+ s\s+\d+ rows$", out, re.M)) == 5
    assert re.search(r"five sets together, one process:\s+[\d.]+ s", out)
    assert re.search(r"five sets together, 1 worker\(s\):\s+[\d.]+ s \(tables equal; ratio [\d.]+x\)", out)
    assert re.search(r"total \(load \+ five sets on 1 worker\(s\)\):\s+[\d.]+ s", out)
    assert "(tables equal)" in out and re.search(r"speed-up \(reference / together\):\s+[\d.]+x", out)


def test_decoding_proxy_prints_each_decodings_operators_and_peak_memory_over_greedy():
    """In the device check's regime (each decoding's variant set first, then its batch, as bench/gpu_scoring.py
    does: on LLaVA every decoding's calls of four batches), with the operators beyond greedy's."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "decoding_proxy.py"), "--smoke", "--regime", "gpu",
                          "--breakdown", "3"], capture_output=True, text=True, timeout=600, check=True).stdout
    assert "batch 64, calls sized per decoding (its variant first, then its batch)," in out
    rows = re.findall(r"^  (\w+) +([\d.]+) ops/prompt +([\d.]+)x greedy +[\d.]+ positions/prompt +([\d.]+)x +"
                      r"peak +([\d.]+) MiB +([\d.]+)x greedy +calls of +(\d+)", out, re.M)
    assert [row[0] for row in rows] == ["greedy", "beam5", "sample", "vcd_greedy", "vcd_sample", "vcd_beam5", "opera"]
    assert rows[0][2] == rows[0][3] == rows[0][5] == "1.00" and all(float(row[1]) > 0 and float(row[4]) > 0
                                                                    for row in rows)
    calls = {row[0]: int(row[6]) for row in rows}
    assert calls["greedy"] == calls["beam5"] == calls["opera"] == 256
    assert float(rows[1][2]) > 1.0  # beam search decodes every answer: more operators than greedy's scoring
    positions = {row[0]: float(row[3]) for row in rows}  # the arithmetic: VCD runs every prompt twice
    assert positions["beam5"] > 1.0 and 1.9 <= positions["vcd_greedy"] <= 2.1 < positions["vcd_beam5"]
    assert len(re.findall(r"^      beyond greedy: \w+ [\d.]+, \w+ [\d.]+, \w+ [\d.]+$", out, re.M)) == 6


def test_remote_batching_benchmark_runs_in_smoke_mode():
    """bench/remote_batching.py --smoke on mPLUG-Owl2's tiny model in its worker env: one row per model, the
    batched path ran (one image prefix per image, no one-question fallback) and its logits equal one at a time."""
    sys.path.insert(0, str(REPO / "tests"))
    from remote_tiny import worker_env

    worker_env("mplug_owl2")  # skip (or fail where the envs are required) without the code or the env
    out = subprocess.run([sys.executable, str(REPO / "bench" / "remote_batching.py"), "--smoke", "--models",
                          "mplug_owl2"], capture_output=True, text=True, timeout=600, check=True).stdout
    row = re.search(r"^mplug_owl2 +tiny \(smoke\) +6 +([\d.]+) +([\d.]+) +([\d.]+)x +([\d.e+-]+)$", out, re.M)
    assert row and float(row.group(3)) > 0 and float(row.group(4)) < 1e-5, out
    assert '"forwards": {"prefix": 2' in out and '"single": 0}' in out


def test_decoding_proxy_counts_cudas_path_as_the_launch_proxy_does():
    """--path cuda: the engine set up as bench/launches.py sets up CUDA's path (OPERA in one forward per step) and
    counted with its count_launches, whose names keep their namespace beyond aten (FlexAttention's fused region,
    inductor's kernels). The decoder layers stay eager here (VERBMIRAGE_COMPILE_LAYERS=0): compiled by inductor on
    the CPU the smoke takes minutes, not seconds; greedy and OPERA only, the one decoding that runs otherwise on CUDA."""
    env = {**os.environ, "VERBMIRAGE_COMPILE_LAYERS": "0"}
    out = subprocess.run([sys.executable, str(REPO / "bench" / "decoding_proxy.py"), "--smoke", "--regime", "gpu",
                          "--path", "cuda", "--only", "opera", "--breakdown", "40"], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    assert "cuda path (decoder layers eager, OPERA in one forward per step): 1 language layers" in out
    rows = re.findall(r"^  (\w+) +([\d.]+) ops/prompt +([\d.]+)x greedy +[\d.]+ positions/prompt +[\d.]+x +"
                      r"peak +[\d.]+ MiB +[\d.]+x greedy +calls of +(\d+)", out, re.M)
    assert [(row[0], row[3]) for row in rows] == [("greedy", "256"), ("opera", "256")]
    assert float(rows[1][2]) > 1.0
    beyond = dict(re.findall(r"([\w:]+) ([\d.]+)", out.split("beyond greedy: ")[1].splitlines()[0]))
    assert "verbmirage::fused" in beyond and "item" in beyond  # launches.py's count: fused regions, host reads


def test_the_ending_model_ends_its_answers_after_their_yes_or_no(tmp_path, monkeypatch):
    """bench_scoring.make_ending (decoding_proxy.py and gpu_scoring.py --ending): beam search on the random model
    steps to its last new token; made ending, its answers end after their yes or no and it stops stepping then,
    as on a trained model. (The narrow model's vocabulary runs past its tokenizer's: the answers' text cannot
    show their random tokens, the steps do.)"""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from bench_scoring import hico_like_questions, make_decisive, make_ending
    from decoding_proxy import SMOKE
    from gpu_scoring import RandomLlava7B
    from verbmirage.models.hf.steppers import InPlaceStepper
    from verbmirage.models.tiny import build_tiny_llava
    from verbmirage.variants.settings import Variant

    monkeypatch.setattr(RandomLlava7B, "size", SMOKE)
    steps, advance = [], InPlaceStepper.advance
    monkeypatch.setattr(InPlaceStepper, "advance", lambda self, tokens: steps.append(len(tokens)) or
                        advance(self, tokens))
    processor = build_tiny_llava(tmp_path / "processor", image_size=336, patch_size=14)
    model = RandomLlava7B("narrow", str(processor), dtype="float32", device="cpu", local_files_only=True)
    make_decisive(model)
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 3, "max_new_tokens": 5}))
    questions = hico_like_questions(1, tmp_path / "yn")[:4]
    model.score_yes_no(questions)
    assert steps == [12] * 4, steps  # 4 questions' 3 beams, to the 5th token
    steps.clear()
    make_ending(model)
    answers = [answer.raw_answer.strip().lower() for answer in model.score_yes_no(questions)]
    assert steps == [12] and set(answers) <= {"yes", "no"}, (steps, answers)  # fed their yes or no, then ended
