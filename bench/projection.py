"""How long the whole HICO suite and the paper config take at measured rates.

The prompts are the real HICO question counts (docs/questions.md, "Counts on the real anno.mat": seed 0, the
default protocol; an MC question once per rotation of its options), and on the single-instance images for a
crop condition (same page, "Counts on the real test instances"). The paper config's runs come from its plan
(configs/paper.yaml through verbmirage.workflow.plan): every run of a model the transformers engine serves adds
its sets' prompts to its variant's decoding, and every run of a remote-code model (Qwen-VL-Chat,
MiniCPM-Llama3-V-2.5, mPLUG-Owl2, Molmo: their own code in a worker, docs/models.md) likewise to the
remote-code models' mix and to its own. The remote-code models are projected three ways: each at its own rate
(:func:`remote_rates`: their batches as built, the whole config's total), all at the engine's rates (what
batching them like the engine aims at) and one question at a time (at the measured rate of transformers
``generate`` at batch 1, when given: how they ran before batching). API models, baselines and CLIP are named
but not projected; nor are the CharadesEgo sets and the Known-Object set, whose real counts are not measured
here.

    python bench/projection.py [--config configs/paper.yaml] [--write MIX.json]   # the paper config's prompt mix
    bench/gpu_scoring.py --decodings reads the mix (computed here, where Snakemake's schema check is installed,
    and carried to the device in .whl/ by bench/h200_wheels.sh) and prints the projection with its rates.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Rows of each HICO set on the real anno.mat (docs/questions.md), all test images.
HICO_PROMPTS = {"yn_obj": 40_749, "yn_verb": 40_731, "mc_obj": 59_516, "mc_verb": 59_852, "obj_exist": 22_770}
#: The same on the single-instance images (1,400 images), what a crop condition asks (docs/questions.md).
SINGLE_INSTANCE_PROMPTS = {"yn_obj": 6_042, "mc_obj": 4 * 2_357, "mc_verb": 4 * 2_357}
#: H200 prompts/s of one question per forward: transformers ``generate`` at batch 1 (5 new tokens) on a
#: LLaVA-1.5-7B-size model, bf16, measured at 5.17-5.35 (bench/README.md, "Remote-code models batched"): how the
#: remote-code models ran before batching (a full forward with the vision tower per question; 7B each).
ONE_AT_A_TIME_RATE = 5.3
#: Scoring speed-up of batches over one question at a time, per backend: the CPU proxies of
#: bench/remote_batching.py at real geometry (bench/README.md, "Remote-code models batched").
REMOTE_SCORING_SPEEDUP = {"qwen_vl_chat": 7.1, "minicpm_v": 5.0, "mplug_owl2": 3.8, "molmo": 9.0}
#: The decodings bench/bench_scoring.py and bench/gpu_scoring.py time, by these names.
DECODING_NAMES = ("greedy", "beam5", "sample", "vcd_greedy", "vcd_sample", "vcd_beam5", "opera")


def decoding_of(variant: dict) -> str:
    """The timed decoding a variant's settings run (a prompt suffix or a calibrated decision decode greedily)."""
    decoding = variant.get("decoding", "greedy")
    if decoding == "opera":
        return "opera"
    kind = {"beam": "beam5", "sample": "sample"}.get(decoding, "greedy")
    return f"vcd_{kind}" if variant.get("vcd") is not None else kind


def paper_mix(config_path: Path = REPO / "configs" / "paper.yaml") -> dict:
    """The config's prompts per decoding over its transformers-engine models and over its remote-code models,
    and the models left out."""
    import yaml
    from snakemake.utils import validate

    sys.path.insert(0, str(REPO / "src"))
    from verbmirage.models.registry import backends_of_kind
    from verbmirage.workflow.plan import Plan
    from verbmirage.workflow.run_folders import run_folders

    engine_backends = backends_of_kind("transformers")  # the backends the transformers engine serves
    remote_backends = backends_of_kind("remote")  # remote-code checkpoints, their own code on a GPU

    config = yaml.safe_load(config_path.read_text())
    demo = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"] = copy.deepcopy(demo["datasets"])  # the real data need not be here: only the runs count
    validate(config, str(REPO / "schemas" / "config.schema.yaml"))  # the schema's defaults, as the workflow fills
    plan = Plan.from_config(config, run_folders(config["results_dir"], [str(config_path)], REPO, REPO))
    prompts, remote_prompts = dict.fromkeys(DECODING_NAMES, 0), dict.fromkeys(DECODING_NAMES, 0)
    engine, left_out, unknown_sets, remote = set(), set(), set(), {}
    for run in plan.scored:
        backend = (plan.config["models"].get(run.model) or {}).get("backend")
        if backend in engine_backends:
            engine.add(run.model)
            targets = [prompts]
        elif backend in remote_backends:
            targets = [remote_prompts, remote.setdefault(run.model, {"backend": backend, "prompts": {}})["prompts"]]
        else:
            left_out.add(run.model)
            continue
        crop = plan.config["conditions"].get(run.condition, {}).get("type") == "crop"
        counts = SINGLE_INSTANCE_PROMPTS if crop else HICO_PROMPTS
        decoding = decoding_of(plan.config["variants"][run.variant])
        for qset in run.qsets:
            if run.dataset == "hico" and qset in counts:
                for target in targets:
                    target[decoding] = target.get(decoding, 0) + counts[qset]
            else:
                unknown_sets.add(f"{run.dataset}/{qset}")
    return {"config": str(config_path.relative_to(REPO)), "prompts": prompts, "engine_models": sorted(engine),
            "remote_prompts": remote_prompts, "remote_models": sorted(remote), "remote_runs": dict(sorted(remote.items())),
            "left_out": sorted(left_out), "not_counted": sorted(unknown_sets)}


def remote_rates(backend: str, costs: dict[str, float]) -> dict[str, float]:
    """Projected H200 prompts/s of a remote-code backend per decoding.

    greedy (scoring from the first answer position, batched on each image's prefix): the one-at-a-time rate
    times the backend's CPU-proxy scoring speed-up. A decoding through the checkpoint's own batched ``generate``
    (beam5): that rate divided by the decoding's cost relative to greedy as measured for the engine (``costs``;
    an estimate: the remote models' own decodings are not timed on a GPU yet). sample: each question draws
    with its own seed, one ``generate`` at a time: the one-at-a-time rate.
    """
    batched = ONE_AT_A_TIME_RATE * REMOTE_SCORING_SPEEDUP[backend]
    rates = {name: batched / costs.get(name, float("nan")) for name in DECODING_NAMES if name != "sample"}
    return {**rates, "greedy": batched, "sample": ONE_AT_A_TIME_RATE}


def projection_lines(greedy_suite_rate: float, costs: dict[str, float], mix: dict | None,
                     generate_rate: float | None = None) -> list[str]:
    """The projected times: the whole HICO suite at the greedy suite rate (prompts/s); the mix's prompts of each
    decoding at that rate divided by the decoding's cost relative to greedy (``costs``); the remote-code models'
    prompts at those rates and, with ``generate_rate`` (prompts/s of ``generate`` at batch 1, greedy), one
    question at a time at that rate over the same costs; the whole config's GPU-hours."""
    suite = sum(HICO_PROMPTS.values())
    lines = ["projection (real HICO counts, docs/questions.md; rates measured above):",
             f"  whole HICO suite, greedy: {suite:,} prompts in {suite / greedy_suite_rate / 60:.1f} min"]
    if mix is None:
        return lines + ["  paper config: no prompt mix (bench/projection.py --write; bench/h200_wheels.sh does it)"]

    def hours(prompts: dict, rate: float) -> dict:
        return {name: count * costs.get(name, float("nan")) / rate / 3600 for name, count in prompts.items() if count}

    engine = hours(mix["prompts"], greedy_suite_rate)
    lines.append(f"  {mix['config']}, its {len(mix['engine_models'])} transformers-engine models "
                 f"({', '.join(mix['engine_models'])}), each at these LLaVA-1.5-7B rates: "
                 f"{sum(mix['prompts'].values()):,} prompts in {sum(engine.values()):.1f} h")
    lines.append("    " + ", ".join(f"{name} {count:,} prompts {engine[name]:.2f} h"
                                      for name, count in mix["prompts"].items() if count))
    remote_prompts = mix.get("remote_prompts", {})
    remote_hours = 0.0
    for model, runs in mix.get("remote_runs", {}).items():
        rates = remote_rates(runs["backend"], costs)
        own = {name: count / rates[name] / 3600 for name, count in runs["prompts"].items() if count}
        remote_hours += sum(own.values())
        lines.append(f"  {model} (remote code, {rates['greedy']:.1f} prompts/s scoring): "
                     + ", ".join(f"{name} {count:,} prompts {own[name]:.2f} h"
                                 for name, count in runs["prompts"].items() if count))
    if any(remote_prompts.values()):
        batched = hours(remote_prompts, greedy_suite_rate)
        lines.append(f"  its {len(mix['remote_models'])} remote-code models ({', '.join(mix['remote_models'])}): "
                     f"{sum(remote_prompts.values()):,} prompts in {remote_hours:.1f} h at their own rates, "
                     f"{sum(batched.values()):.1f} h at the engine's rates (batched like the engine)" + (
                         f", {sum(hours(remote_prompts, generate_rate).values()):.1f} h one question at a time "
                         f"(generate at batch 1, {generate_rate:.2f} prompts/s)" if generate_rate else ""))
    total = sum(engine.values()) + remote_hours
    lines.append(f"  whole config, every GPU model: {total:.1f} GPU-hours (target <= 10)")
    lines.append(f"  not projected: {', '.join(mix['left_out'])} (API, baselines, CLIP); sets without "
                 f"real counts here: {', '.join(mix['not_counted']) or 'none'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "paper.yaml")
    parser.add_argument("--write", type=Path, help="write the prompt mix as JSON here (else print it)")
    args = parser.parse_args(argv)
    mix = paper_mix(args.config.resolve())
    text = json.dumps(mix, indent=1)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
