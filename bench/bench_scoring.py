"""Benchmark: the scoring engine vs transformers ``generate`` at batch 1, on a random and on a decisive model,
and the cost of each decoding.

(a) is the default path of lmms-eval and VLMEvalKit: one question at a time, ``generate`` a short answer
(``--new-tokens``, 5 by default) and read the first token's scores; (b) is our engine (prefix reuse,
length-sorted batches, a greedy continuation only where the first answer token decides nothing). Both answer the
same yn_obj and yn_verb questions (about 10 per image, as in HICO) on one random-weight model with LLaVA-1.5
geometry (336 px, patch 14 -> 576 image tokens; narrow layers so it runs on a CPU), in two regimes:

- **random**: the model as built. Its first answer token is yes or no for only about a third of the questions,
  so the engine decodes the others greedily (``--continue-tokens``);
- **decisive**: the same weights with the output layer biased towards the yes and no tokens (:func:`make_decisive`),
  so the first token decides nearly every answer, as a trained model's does; which answer stays random.

For each: prompts/s of (a) and (b), their ratio, the share of answers the engine continued, and the largest
P(yes) difference between the paths. Then, on the decisive model and the same questions, each decoding the
paper's tables use (greedy, beam-5, sampling, VCD greedy / sampling / beam, OPERA): prompts/s and the cost
relative to greedy, with the peak memory (on a GPU, each decoding's peak allocation; on the CPU, the process's peak
resident memory). A cost is the median over ``--repeats`` pairs of passes run back to back, each decoding against
the one it is compared with (VCD against its plain decoding, OPERA against beam-5, the rest against greedy); a
rate is the best of its passes. Last, each ratio the engine is built to reach, with its target.

    python bench/bench_scoring.py [--images 12] [--device cpu] [--dtype float32] [--skip-decodings]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from verbmirage.benchmark.questions import QuestionSettings, build_question_set  # noqa: E402
from verbmirage.data.demo import DemoSizes, write_demo_hico  # noqa: E402
from verbmirage.data.hico import load_hico  # noqa: E402
from verbmirage.models import Question, create_model  # noqa: E402
from verbmirage.models.hf.compiled_layers import eager_layers  # noqa: E402
from verbmirage.models.tiny import build_tiny_llava  # noqa: E402
from verbmirage.variants.settings import Variant  # noqa: E402

#: The decodings of the paper's Tables 5 and 8 (and the demo's), as variant entries of the config.
#: Each is timed against the decoding it is compared with (:data:`BASELINES`).
DECODINGS = {
    "greedy": {},
    "beam5": {"decoding": "beam", "num_beams": 5},
    "sample": {"decoding": "sample"},
    "vcd_greedy": {"vcd": {}},
    "vcd_sample": {"decoding": "sample", "vcd": {}},
    "vcd_beam5": {"decoding": "beam", "num_beams": 5, "vcd": {}},
    "opera": {"decoding": "opera", "num_beams": 5},
}
#: The decoding each one's cost is measured against, pass for pass: VCD against its plain decoding, OPERA against
#: beam search with as many beams, the rest against greedy.
BASELINES = {"greedy": "greedy", "beam5": "greedy", "sample": "greedy", "vcd_greedy": "greedy",
             "vcd_sample": "sample", "vcd_beam5": "beam5", "opera": "beam5"}


def hico_like_questions(n_images: int, work: Path) -> list[Question]:
    """yn_obj + yn_verb questions of the first ``n_images`` demo images (~10 per image, as in HICO)."""
    write_demo_hico(work / "hico", work / "det", DemoSizes(train=50, test=n_images * 2))
    anno = load_hico(work / "hico")
    questions = []
    for qset in ("yn_obj", "yn_verb"):
        table = build_question_set(anno, qset, QuestionSettings())
        questions += [row for row in table.itertuples()]
    images = sorted({row.image for row in questions})[:n_images]
    rng = np.random.default_rng(0)
    paths = {}
    for image in images:
        path = work / f"{Path(image).stem}.png"
        Image.fromarray(rng.integers(0, 255, (336, 448, 3), dtype=np.uint8)).save(path)
        paths[image] = path
    chosen = [row for row in questions if row.image in paths]
    chosen.sort(key=lambda row: row.image)
    return [Question(row.question_id, row.prompt, image=paths[row.image]) for row in chosen]


def make_decisive(model, boost: float = 12.0, decisive: bool = True) -> None:
    """Bias the language model's output layer towards the yes and no tokens (``boost`` added to their logits),
    as answer training does: the first answer token then says yes or no for nearly every YN question, while which
    one stays the random weights' choice. The bias is a parameter of the real output layer, so ``generate`` and
    the engine read the same logits. ``decisive=False`` takes the bias away again (the model as built)."""
    head = model.model.get_output_embeddings()
    if not decisive:
        head.bias = None
        return
    bias = torch.zeros(head.out_features, dtype=head.weight.dtype, device=head.weight.device)
    bias[torch.cat([model._yes_ids, model._no_ids]).to(bias.device)] = boost
    head.bias = torch.nn.Parameter(bias, requires_grad=False)


def make_ending(model, logit: float = 30.0) -> None:
    """Make the model end its answer after a yes or no token, as an answer-trained model does ("Yes", then the
    end token): each yes and no token's input embedding is set to one long direction u, and the end token's row
    of the output layer to u, scaled so that after the final norm the end token's logit is ``logit`` where the
    input is a yes or no token (about ``logit`` / sqrt(hidden) times a unit normal elsewhere). The random
    weights never end an answer early, so without this every decoding decodes all its new tokens; with it a
    decisive model's (:func:`make_decisive`) YN answers end after their second token and a decoding stops once
    its rows have ended, as it would on a trained model. The first token is still a yes or a no, its
    probabilities moved a little (the prompt's own "yes or no" carries the new embedding). It changes the weights
    for good (for a bench run)."""
    embeddings, head = model.model.get_input_embeddings(), model.model.get_output_embeddings()
    hidden = head.in_features
    generator = torch.Generator().manual_seed(7)
    direction = torch.randn(hidden, generator=generator)
    direction = direction / direction.norm()
    stop = sorted(model.stop_tokens())
    with torch.no_grad():
        # 10^4 times a random row's norm: the layers' random updates (each about a row's norm per element at
        # LLaVA's width) stay small beside it, so the residual stream at those positions points along u throughout
        length = 1e4 * float(embeddings.weight.float().norm(dim=-1).mean())
        yes_no = torch.cat([model._yes_ids, model._no_ids]).to(embeddings.weight.device)
        embeddings.weight[yes_no] = (direction * length).to(embeddings.weight)
        head.weight[stop] = (direction * logit / hidden ** 0.5).to(head.weight)


def generate_batch1(model, questions: list[Question], new_tokens: int) -> list[float]:
    """The harness path: one question at a time, generate, P(yes) from the first generated token's scores. The
    decoder layers run eagerly, as the harnesses' do, also where the engine compiles them (on CUDA)."""
    p_yes = []
    for question in questions:
        encoded = model.encode([model.render(question, False)], [model.open_image(question.image)])
        with torch.inference_mode(), eager_layers():
            output = model.model.generate(
                **encoded, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                output_scores=True, return_dict_in_generate=True,
            )
        probs = torch.softmax(output.scores[0][0].float(), dim=-1).cpu()
        yes, no = probs[model._yes_ids].sum(), probs[model._no_ids].sum()
        p_yes.append(float(yes / (yes + no)))
    return p_yes


class Counted:
    """Counts the questions the engine hands to its greedy continuation (an undecided first token)."""

    def __init__(self, model):
        self.count, original = 0, model.continue_answers

        def continue_answers(questions, multiple_choice, **handoff):  # the scoring pass's openings, passed on
            self.count += len(questions)
            return original(questions, multiple_choice, **handoff)

        model.continue_answers = continue_answers


#: LLaVA-1.5-7B's vision tower (CLIP ViT-L/14 at 336 px: ~0.30B parameters over 577 tokens) per image, in
#: positions of its 6.7B language model (about 2 x parameters each): 577 x 0.30 / 6.7
VISION_POSITIONS = 26


class Arithmetic:
    """What a LLaVA model computes within the block, counted by hooks: the language model's token positions
    (each forward's rows times its columns, padding included) and the images the vision tower encodes;
    ``total`` counts an image as :data:`VISION_POSITIONS` positions. A 7B model computes about twice its
    parameters per position (the attention over a prompt of ~600 keys adds about 2% in LLaVA-1.5-7B, not
    counted), so on a GPU computing at its peak a decoding's time over greedy's is its total's ratio; where the
    GPU waits on launches, their count is what sets it (bench/decoding_proxy.py prints both)."""

    def __init__(self, model):
        self.positions = self.images = 0
        self._modules = (model.model.get_decoder(), model.model.model.vision_tower)
        self._hooks = []

    def __enter__(self) -> "Arithmetic":
        language, vision = self._modules
        self._hooks = [language.register_forward_pre_hook(self._language, with_kwargs=True),
                       vision.register_forward_pre_hook(self._vision, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()

    @property
    def total(self) -> int:
        return self.positions + VISION_POSITIONS * self.images

    def _language(self, module, args, kwargs):
        given = next((kwargs[name] for name in ("inputs_embeds", "input_ids") if kwargs.get(name) is not None),
                     args[0] if args else None)
        self.positions += given.shape[0] * given.shape[1]

    def _vision(self, module, args, kwargs):
        pixels = kwargs["pixel_values"] if kwargs.get("pixel_values") is not None else args[0]
        self.images += pixels.shape[0]


def engine_pass(model, questions: list[Question], batch_size: int, synchronize) -> tuple[list, float]:
    """The engine's answers to ``questions`` in calls of ``batch_size`` (prefixes forgotten first), and seconds."""
    model.forget_prefixes()
    synchronize()
    start = time.perf_counter()
    results = []
    for i in range(0, len(questions), batch_size):
        results += model.score_yes_no(questions[i : i + batch_size])
    synchronize()
    return results, time.perf_counter() - start


def best_pass(model, questions, args, synchronize) -> tuple[list, float]:
    """The engine's answers and its best time over ``--repeats`` passes (this machine's speed drifts by up to
    20% within a minute; the best pass is the one least disturbed)."""
    passes = [engine_pass(model, questions, args.batch_size, synchronize) for _ in range(args.repeats)]
    return passes[0][0], min(seconds for _, seconds in passes)


def compare_with_generate(model, questions, args, synchronize, counter: Counted) -> float:
    """Prints the comparison; returns the engine's prompts/s."""
    model.score_yes_no(questions[:2])  # warm-up
    synchronize()
    start = time.perf_counter()
    reference = generate_batch1(model, questions, args.new_tokens)
    synchronize()
    generate_rate = len(questions) / (time.perf_counter() - start)
    counter.count = 0
    results, seconds = best_pass(model, questions, args, synchronize)
    engine_rate = len(questions) / seconds
    difference = max(abs(r.p_yes - p) for r, p in zip(results, reference))
    print(f"  generate, batch 1, {args.new_tokens} new tokens: {generate_rate:8.2f} prompts/s")
    print(f"  engine (prefix reuse, batched):        {engine_rate:8.2f} prompts/s")
    print(f"  ratio engine / generate:               {engine_rate / generate_rate:8.2f}x")
    print(f"  answers continued past the first token: {counter.count / (len(questions) * args.repeats):7.1%}")
    print(f"  max |P(yes) difference|:               {difference:.2e}")
    return engine_rate, engine_rate / generate_rate


def peak_memory(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**20:8.0f} MiB allocated"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:8.0f} MiB resident (process)"


def paired_ratio(first, second, repeats: int) -> tuple[float, float, float]:
    """Times ``first()`` and ``second()`` (each returns its seconds) back to back ``repeats`` times, in alternating
    order: (the median over the pairs of second's time over first's, first's best, second's best). A pair measured
    back to back shares the machine's moment; best times from different moments need not (this machine's speed
    drifts by up to 20% within a minute)."""
    pairs = []
    for repeat in range(repeats):
        if repeat % 2:
            other = second()
            pairs.append((first(), other))
        else:
            pairs.append((first(), second()))
    return float(np.median([b / a for a, b in pairs])), min(a for a, _ in pairs), min(b for _, b in pairs)


def decoding_costs(model, questions, args, synchronize) -> dict[str, float]:
    """Prints each decoding's rate and cost, measured against its baseline pass for pass (:data:`BASELINES`) and
    chained to greedy; returns each cost over its baseline by slug (``opera`` is OPERA / beam-5)."""
    print(f"decodings on the decisive model ({len(questions)} questions, {args.max_new_tokens} new tokens per "
          "decoded answer): prompts/s, cost over greedy (and over its baseline, timed pass for pass), peak memory")
    variants = {}
    for slug, entry in DECODINGS.items():
        settings = {**entry, "max_new_tokens": args.max_new_tokens} if entry.get("decoding") else entry
        variants[slug] = Variant.from_config(settings)

    def timed(slug: str):
        def run() -> float:
            model.use_variant(variants[slug])
            return engine_pass(model, questions, args.batch_size, synchronize)[1]
        return run

    over_baseline, over_greedy = {}, {"greedy": 1.0}
    for slug in DECODINGS:
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        model.use_variant(variants[slug])
        model.score_yes_no(questions[:2])  # warm-up
        baseline = BASELINES[slug]
        ratio, _, best = paired_ratio(timed(baseline), timed(slug), args.repeats)
        over_baseline[slug] = 1.0 if slug == baseline else ratio
        over_greedy[slug] = over_baseline[slug] * over_greedy[baseline]
        against = "" if baseline == "greedy" else f" ({over_baseline[slug]:5.2f}x {baseline})"
        print(f"  {slug:11s} {len(questions) / best:8.2f} prompts/s  {over_greedy[slug]:6.2f}x greedy{against:16s}"
              f"  {peak_memory(args.device)}")
    model.use_variant(Variant.from_config({}))
    return over_baseline


def continuation_cost(model, questions, args, synchronize) -> float:
    """The time the random model's greedy continuations add to the scoring pass, over that pass: random and
    decisive passes timed pass for pass (the output layer's bias on and off)."""
    def regime(decisive: bool):
        def run() -> float:
            make_decisive(model, decisive=decisive)
            return engine_pass(model, questions, args.batch_size, synchronize)[1]
        return run

    ratio, *_ = paired_ratio(regime(True), regime(False), args.repeats)
    make_decisive(model)
    print(f"continuation pass / scoring pass (random over decisive, pass for pass, minus 1): {ratio - 1:.2f}")
    return ratio - 1


#: Each goal the engine is built to (the speed of scoring kept once answers are decoded, each decoding's price):
#: (what, its ratio from the run's figures, the target, whether the ratio should be at least or at most that).
TARGETS = [
    ("random: engine / generate", lambda f: f["random"], 10.0, "at least"),
    ("decisive: engine / generate", lambda f: f["decisive"], 15.0, "at least"),
    ("continuation pass / scoring pass", lambda f: f["continuation"], 0.5, "at most"),
    ("beam-5 / greedy", lambda f: f["beam5"], 2.0, "at most"),
    ("VCD greedy / greedy", lambda f: f["vcd_greedy"], 2.2, "at most"),
    ("VCD sampling / sampling", lambda f: f["vcd_sample"], 2.2, "at most"),
    ("VCD beam-5 / beam-5", lambda f: f["vcd_beam5"], 2.2, "at most"),
    ("OPERA / beam-5", lambda f: f["opera"], 8.0, "at most"),
]


def print_targets(figures: dict[str, float]) -> None:
    """Each target's ratio in this run and whether it holds."""
    print("targets (ratios of this run):")
    for what, ratio, target, bound in TARGETS:
        try:
            value = ratio(figures)
        except KeyError:  # --skip-decodings
            continue
        held = value >= target if bound == "at least" else value <= target
        print(f"  {what:34s} {value:6.2f}  ({bound} {target:g}: {'met' if held else 'missed'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=5, help="tokens generate decodes per answer in (a)")
    parser.add_argument("--continue-tokens", type=int, default=8,
                        help="the engine's greedy continuation of an undecided answer (inference.continue_tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens each decoding decodes per answer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--skip-decodings", action="store_true", help="only the engine vs generate")
    parser.add_argument("--repeats", type=int, default=7,
                        help="engine passes per measurement (the best counts) and pairs per cost (the median counts)")
    args = parser.parse_args()
    synchronize = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = build_tiny_llava(work / "llava336", image_size=336, patch_size=14, hidden_size=128, layers=4)
        model = create_model("bench", {"backend": "llava", "path": str(path), "device": args.device,
                                       "dtype": args.dtype, "local_files_only": True})
        model.continue_tokens = args.continue_tokens
        questions = hico_like_questions(args.images, work)
        print(f"{len(questions)} questions on {args.images} images ({len(questions) / args.images:.1f} per image), "
              f"576 image tokens, device {args.device}")
        counter = Counted(model)
        figures: dict[str, float] = {}
        print("random model (as built):")
        figures["random_rate"], figures["random"] = compare_with_generate(model, questions, args, synchronize, counter)
        make_decisive(model)
        print("decisive model (output layer biased to yes/no):")
        figures["decisive_rate"], figures["decisive"] = compare_with_generate(model, questions, args, synchronize,
                                                                              counter)
        figures["continuation"] = continuation_cost(model, questions, args, synchronize)
        if not args.skip_decodings:
            figures.update(decoding_costs(model, questions, args, synchronize))
        print(f"peak memory: {peak_memory(args.device)}")
        print_targets(figures)


if __name__ == "__main__":
    main()
