"""The remote-code models batched vs one question at a time, on CPU proxies of their real geometry.

    python bench/remote_batching.py [--models qwen_vl_chat,minicpm_v,molmo,mplug_owl2] [--per-image 12]
    python bench/remote_batching.py --smoke          # tiny sizes, seconds: checks that the script runs
    python bench/remote_batching.py --models molmo --device cuda --dtype bfloat16   # on a GPU (h200_check.sh)

For each model a random-weight checkpoint is built from its own code (``../shared/remote_code``, or
``$VERBMIRAGE_REMOTE_CODE``) in its worker env (``tools/make_envs.sh``), with the real config's widths,
vocabulary, image resolution and image-token counts and only the depth cut (:data:`PROXY_DEPTH`: every
language-model and vision stack to 2 layers, Molmo's vision to 9 (it reads layers -2 and -9), the mPLUG-Owl2
abstractor to 1), then timed through our driver
in that env, float32 on the CPU (``--device``, ``--dtype``: on a GPU, the proxy built in that dtype):

- one at a time: ``Driver.logits`` per question (what the adapter did before batching); its time per question
  does not depend on how many questions an image has, so it is measured on ``--single`` questions and
  multiplied out;
- batched: ``Driver.logits_batch`` over all questions (each image's prefix once, its questions as rows on the
  cache, at most ``--batch-size`` per forward).

The questions are HICO's kinds (a YN question and an MC question with four options, docs/questions.md),
``--per-image`` of them per image on ``--images`` 640x480 images. Tokenizers: Qwen-VL-Chat and Molmo carry
their real ones; MiniCPM's and mPLUG-Owl2's are not in the code folders and are the tests' stand-ins (bytes and a
few words: their questions run longer than with the real ones, which only adds to the batched side's work).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REMOTE_CODE = Path(os.environ.get("VERBMIRAGE_REMOTE_CODE", REPO.parent / "shared" / "remote_code"))
ENVS = Path(os.environ.get("VERBMIRAGE_ENVS_DIR", REPO / ".envs"))
MODELS = {"qwen_vl_chat": ("qwen_vl_chat", "remote-qwen_vl_chat"),
          "minicpm_v": ("minicpm_llama3_v2_5", "remote-minicpm_v"),
          "molmo": ("molmo_7b_d", "remote-molmo"),
          "mplug_owl2": ("mplug_owl2", "remote-mplug_owl2")}
#: What the proxies keep of the real depth (layers: real -> proxy); everything else is the real config's.
PROXY_DEPTH = {
    "qwen_vl_chat": "Qwen-7B LM 32 -> 2 layers, ViT-bigG 48 -> 2 layers (width 1664, 448 px, 256 image tokens)",
    "minicpm_v": "Llama-3-8B LM 32 -> 2 layers, SigLIP 27 -> 2 layers (width 1152; slices of 448 px, 96 tokens each)",
    "molmo": "Qwen2-7B LM 28 -> 2 layers, CLIP ViT-L 23 -> 9 layers (336 px crops, up to 12 + 1)",
    "mplug_owl2": "LLaMA-2-7B LM 32 -> 2 layers, ViT-L 24 -> 2 layers, abstractor 6 -> 1 layer (448 px, 64 queries)",
}
PROXY_LAYERS = 2
YN = "Is the person {verb} the {object}?\nAnswer yes or no."
MC = ("Which action is the person doing with the {object}?\nA. {verb}\nB. feeding\nC. washing\nD. holding\n"
      "Answer with the option's letter from the given choices directly.")
PAIRS = [("riding", "horse"), ("holding", "umbrella"), ("eating", "pizza"), ("walking", "dog"),
         ("repairing", "bicycle"), ("throwing", "frisbee"), ("petting", "cat"), ("carrying", "surfboard")]


def questions(count: int) -> list[str]:
    """``count`` HICO-like prompts, YN and MC alternating, of different lengths."""
    out = []
    for i in range(count):
        verb, obj = PAIRS[(i // 2) % len(PAIRS)]
        out.append((YN if i % 2 == 0 else MC).format(verb=verb, object=obj))
    return out


# ---- in the model's env -------------------------------------------------------------------------------
def build(model: str, target: Path, smoke: bool, dtype: str = "float32") -> None:
    """The proxy (or, with ``smoke``, the tests' tiny model) of ``model`` in ``target``, built in this env, its
    weights saved in ``dtype`` (the proxy's; the tiny models' stay float32)."""
    sys.path.insert(0, str(REPO / "tests"))
    code = REMOTE_CODE / MODELS[model][0]
    if model == "mplug_owl2":
        import remote_tiny_mplug_build as mplug

        if not smoke:
            mplug.LLM_SIZES = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": PROXY_LAYERS,
                               "num_attention_heads": 32, "max_position_embeddings": 4096}
            mplug.VISION_SIZES = {"hidden_size": 1024, "intermediate_size": 4096, "projection_dim": 768,
                                  "num_hidden_layers": PROXY_LAYERS, "num_attention_heads": 16, "image_size": 448,
                                  "patch_size": 14}
            mplug.ABSTRACTOR_SIZES = {"hidden_size": 1024, "num_hidden_layers": 1, "num_attention_heads": 16,
                                      "intermediate_size": 2816, "num_learnable_queries": 64,
                                      "encoder_hidden_size": 1024, "grid_size": 32}
            mplug.write_probe = lambda *args: None
        mplug.build(code, target)
        if not smoke:  # the builder's processor is the tiny one's 56 px: the real one is 448 px
            from transformers import CLIPImageProcessor

            CLIPImageProcessor(size={"shortest_edge": 448}, crop_size={"height": 448, "width": 448}).save_pretrained(
                str(target))
        return
    import remote_tiny_build as tiny

    if smoke:
        tiny.BUILDERS[model](code, target)
        return
    depth = {"qwen_vl_chat": {"num_hidden_layers": PROXY_LAYERS, "visual": {"layers": PROXY_LAYERS},
                              "fp32": dtype == "float32", "fp16": dtype == "float16", "bf16": dtype == "bfloat16",
                              "use_flash_attn": False},
             "minicpm_v": {"num_hidden_layers": PROXY_LAYERS, "vision_config": {"num_hidden_layers": PROXY_LAYERS}},
             "molmo": {"num_hidden_layers": PROXY_LAYERS}}[model]
    tiny.copy_checkpoint_files(code, target)
    if model == "molmo":
        if "import tensorflow" in (target / "image_preprocessing_molmo.py").read_text():
            tiny.use_torchvision_resize(target / "image_preprocessing_molmo.py")
        modeling = target / "modeling_molmo.py"
        # its image features are read from layers -2 and -9 (vit_layers): 9 is the fewest that runs
        modeling.write_text(modeling.read_text().replace("image_num_layers=23,", "image_num_layers=9,"))
    if model == "minicpm_v":
        tiny.write_stand_in_llama3_tokenizer(target)
        sys.path.insert(0, str(REPO / "src" / "verbmirage" / "models"))
        from remote_drivers_llama import supply_list_to_torch_functional

        supply_list_to_torch_functional()
    tiny.shrink_config(target, {**depth, "torch_dtype": dtype})
    tiny._save_model(target, "AutoModel" if model == "minicpm_v" else "AutoModelForCausalLM", dtype)
    if model == "molmo":
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(str(target), trust_remote_code=True)
        tokenizer.backend_tokenizer.save(str(target / "tokenizer.json"))


def measure(model: str, folder: Path, images: int, per_image: int, single: int, batch_size: int,
            device: str = "cpu", dtype: str = "float32") -> dict:
    """Seconds of one-at-a-time and batched scoring through the driver (run in the model's env). Each side's
    logits come back to the host (``.cpu()``), so its time includes all its device work."""
    import numpy as np
    import torch
    from PIL import Image

    sys.path.insert(0, str(REPO / "src" / "verbmirage" / "models"))
    from remote_drivers import DRIVERS

    torch.manual_seed(0)
    options = {"code_dir": str(REMOTE_CODE / "mplug_owl2")} if model == "mplug_owl2" else {}
    start = time.perf_counter()
    driver = DRIVERS[model](str(folder), dtype=dtype, device=device, **options)
    loaded = time.perf_counter() - start
    paths = []
    for i in range(images):
        paths.append(folder / f"bench{i}.jpg")
        pixels = np.random.default_rng(i).integers(0, 256, size=(480, 640, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(paths[-1])
    prompts = questions(per_image)
    items = [(str(path), prompt) for path in paths for prompt in prompts]
    driver.logits(*items[0])  # warm-up: first-call costs (lazy imports, allocations) count for neither side
    calls = _count_image_preprocessing(driver)
    picked = sorted({round(i * (len(items) - 1) / max(1, single - 1)) for i in range(single)})  # first to last
    start = time.perf_counter()
    alone = [driver.logits(*items[i]) for i in picked]
    per_question = (time.perf_counter() - start) / len(alone)
    preprocessing = None if calls is None else {"alone": len(calls)}
    start = time.perf_counter()
    together = driver.logits_batch(items, batch_size)
    batched = time.perf_counter() - start
    if calls is not None:
        preprocessing["batched"] = len(calls) - preprocessing["alone"]
    assert not any(isinstance(row, Exception) for row in together), together
    # the batched path itself ran: one prefix per image, no question fallen back to one at a time
    if driver.forwards.get("single") or driver.forwards.get("prefix") != images:
        raise SystemExit(f"{model}: the batched path fell back (forwards {dict(driver.forwards)}); see its stderr")
    difference = max(float((together[i] - one).abs().max()) for i, one in zip(picked, alone))
    ids = driver.batch_inputs(items[0][0], prompts)[0]
    return {"model": model, "images": images, "per_image": per_image, "questions": len(items),
            "single_measured": len(alone), "single_s_per_question": per_question,
            "one_at_a_time_s": per_question * len(items), "batched_s": batched,
            "speedup": per_question * len(items) / batched, "max_abs_logit_difference": difference,
            "prompt_tokens": [min(map(len, ids)), max(map(len, ids))], "forwards": dict(driver.forwards),
            "device": device, "dtype": dtype, "load_s": loaded, "image_preprocessing": preprocessing,
            "parameters": sum(p.numel() for p in driver.model.parameters())}


def _count_image_preprocessing(driver) -> list | None:
    """A list that grows by one at each call of the driver's image processor from now on (the crops and resizing on
    the host); None where the driver has no such processor to count (its row then says null, not 0)."""
    images = getattr(getattr(driver, "processor", None), "image_processor", None)
    if images is None or not hasattr(images, "preprocess"):
        return None
    calls: list = []
    preprocess = images.preprocess
    images.preprocess = lambda *args, **kwargs: calls.append(1) or preprocess(*args, **kwargs)
    return calls


# ---- in the project's env: one proxy after another -----------------------------------------------------
def run(model: str, args, work: Path) -> dict:
    python = ENVS / MODELS[model][1] / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"worker env {MODELS[model][1]} is not built ({python}): run tools/make_envs.sh")
    folder = work / model
    here = [str(python), str(Path(__file__).resolve())]
    on = ["--device", args.device, "--dtype", args.dtype]
    # the env's own packages only: a PYTHONPATH of this process (h200_check.sh's, holding the project's
    # transformers) would shadow them
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    start = time.perf_counter()
    subprocess.run([*here, "build", model, str(folder), *on, *(["--smoke"] if args.smoke else [])], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    print(f"  {model}: built in {time.perf_counter() - start:.1f} s", flush=True)  # where a time limit went
    result = subprocess.run([*here, "measure", model, str(folder), "--images", str(args.images), "--per-image",
                             str(args.per_image), "--single", str(args.single), "--batch-size", str(args.batch_size),
                             *on], check=True, stdout=subprocess.PIPE, text=True, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="all", choices=("all", "build", "measure"))
    parser.add_argument("model", nargs="?")
    parser.add_argument("folder", nargs="?", type=Path)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--per-image", type=int, default=12, help="questions per image (HICO: ~23)")
    parser.add_argument("--single", type=int, default=3, help="questions timed one at a time")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="where the driver runs the model (cuda on a GPU)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="the weights' dtype (bfloat16 on a GPU, as a job runs)")
    parser.add_argument("--smoke", action="store_true", help="the tests' tiny models, 2 images x 3 questions")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.model, args.folder, args.smoke, args.dtype)
        return 0
    if args.command == "measure":
        print(json.dumps(measure(args.model, args.folder, args.images, args.per_image, args.single, args.batch_size,
                                 args.device, args.dtype)))
        return 0
    if args.smoke:
        args.per_image, args.single = 3, 2
    if not REMOTE_CODE.is_dir():
        raise SystemExit(f"{REMOTE_CODE} is absent (the checkpoints' code; set VERBMIRAGE_REMOTE_CODE)")
    print(f"{args.device}, {args.dtype}")
    print(f"{'model':<14} {'proxy (layers real -> proxy)':<50} {'questions':>9} {'alone s/q':>9} "
          f"{'batched s':>9} {'speed-up':>8} {'max |dlogit|':>12}")
    with tempfile.TemporaryDirectory(prefix="remote_batching_") as work:
        for model in args.models.split(","):
            row = run(model, args, Path(work))
            depth = "tiny (smoke)" if args.smoke else PROXY_DEPTH[model].split(" (")[0]
            print(f"{model:<14} {depth:<50} {row['questions']:>9} {row['single_s_per_question']:>9.2f} "
                  f"{row['batched_s']:>9.2f} {row['speedup']:>7.1f}x {row['max_abs_logit_difference']:>12.1e}",
                  flush=True)
            print("  " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
