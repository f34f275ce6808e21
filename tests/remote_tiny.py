"""Shared set-up of the tiny remote-code checkpoint tests (test_remote_tiny_*.py).

They need ``../shared/remote_code/`` (the checkpoints' own code, never copied
into the repository) and the worker environment that ``configs/paper.yaml``
names for the model, built by ``tools/make_envs.sh``. Without the code folder
they skip; without the environment they skip on a developer machine but fail
where ``VERBMIRAGE_REQUIRE_REMOTE_ENVS=1`` (CI builds the envs first).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
#: The checkpoints' code: ``../shared/remote_code`` beside the repository, or ``$VERBMIRAGE_REMOTE_CODE`` (a
#: worktree kept elsewhere).
REMOTE_CODE = Path(os.environ.get("VERBMIRAGE_REMOTE_CODE", REPO.parent / "shared" / "remote_code"))
BUILDER = Path(__file__).resolve().parent / "remote_tiny_build.py"
CODE_FOLDERS = {"qwen_vl_chat": "qwen_vl_chat", "molmo": "molmo_7b_d", "minicpm_v": "minicpm_llama3_v2_5",
                "mplug_owl2": "mplug_owl2"}
PAPER_SLUGS = {"qwen_vl_chat": "qwen_vl_chat", "molmo": "molmo_7b_d", "minicpm_v": "minicpm_llama3_v25",
               "mplug_owl2": "mplug_owl2"}


def paper_entry(backend: str) -> dict:
    return yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())["models"][PAPER_SLUGS[backend]]


#: transformers 5.x with torchvision: runs the drivers' in-process code path (their 5.x patches) in a worker.
TRANSFORMERS5_ENV = "remote-transformers5"


def worker_env(backend: str) -> str:
    """The env the paper config names for ``backend``, or skip/fail when the code or the env is missing."""
    if not (REMOTE_CODE / CODE_FOLDERS[backend]).is_dir():
        pytest.skip(f"{REMOTE_CODE / CODE_FOLDERS[backend]} is absent")
    return require_env(paper_entry(backend)["env"])


def require_env(env: str) -> str:
    """``env`` if built; else skip, or fail where VERBMIRAGE_REQUIRE_REMOTE_ENVS=1."""
    python = envs_dir() / env / "bin" / "python"
    if not python.exists():
        message = f"worker env '{env}' is not built ({python}): run tools/make_envs.sh {env}"
        if os.environ.get("VERBMIRAGE_REQUIRE_REMOTE_ENVS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return env


def envs_dir() -> Path:
    """Where the worker envs are (tools/make_envs.sh)."""
    return Path(os.environ.get("VERBMIRAGE_ENVS_DIR", REPO / ".envs"))


def build_tiny(backend: str, env: str, target: Path) -> Path:
    """A tiny random-weight checkpoint of ``backend`` built by its own classes, in its own env."""
    python = envs_dir() / env / "bin" / "python"
    result = subprocess.run([str(python), str(BUILDER), backend, str(REMOTE_CODE / CODE_FOLDERS[backend]), str(target)],
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"building the tiny {backend} failed:\n{result.stderr[-4000:]}")
    return target


def open_tiny_model(backend: str, tmp_path_factory, **settings):
    """Our adapter on a freshly built tiny ``backend`` checkpoint, in the env the paper entry names (close it)."""
    from verbmirage.models import create_model

    env = worker_env(backend)
    folder = build_tiny(backend, env, tmp_path_factory.mktemp(f"tiny_{backend}"))
    return create_model(PAPER_SLUGS[backend], tiny_entry(backend, env, folder, **settings))


def module_model(backend: str):
    """A module fixture: our adapter on a tiny ``backend`` built for the module (:func:`open_tiny_model`, at most 4
    new tokens), closed after the module's tests. Assign it to the fixture's name: ``qwen = module_model(...)``."""

    @pytest.fixture(scope="module")
    def model(tmp_path_factory):
        opened = open_tiny_model(backend, tmp_path_factory, max_new_tokens=4)
        yield opened
        opened.close()

    return model


def module_images(folder: str, specs: list[tuple[tuple[int, int], tuple[int, int, int]]]):
    """A module fixture: the :func:`colour_images` of ``specs`` in a new temporary folder named ``folder``."""

    @pytest.fixture(scope="module")
    def images(tmp_path_factory) -> list[Path]:
        return colour_images(tmp_path_factory.mktemp(folder), specs)

    return images


def tiny_entry(backend: str, env: str, path: Path, **settings) -> dict:
    """The paper config's entry, pointed at the tiny checkpoint, on CPU in float32."""
    entry = {**paper_entry(backend), "path": str(path), "dtype": "float32", "device": "cpu", **settings}
    entry.pop("revision", None)  # a local folder is pinned by its files
    for key in ("batch_size", "shards", "resources"):
        entry.pop(key, None)
    entry["env"] = env
    return entry


#: The yes/no question every tiny remote test asks.
YES_NO_PROMPT = "Is someone riding a horse?\nAnswer yes or no."


def colour_images(folder: Path, specs: list[tuple[tuple[int, int], tuple[int, int, int]]]) -> list[Path]:
    """Plain-colour PNGs of the given (size, colour): cheap images of different shapes for the tiny models."""
    paths = []
    for i, (size, colour) in enumerate(specs):
        paths.append(folder / f"img{i}.png")
        Image.new("RGB", size, colour).save(paths[-1])
    return paths


def first_greedy_answer(model, image: Path, prompt: str = YES_NO_PROMPT, max_new_tokens: int = 3) -> dict:
    """Decode greedily twice and score once through the worker; check that decoding is tagged greedy and
    reproducible and that the scored logits' argmax is the first generated token. Returns the decoded reply."""
    score = model.client.request("score", image=str(image), prompt=prompt, token_ids=[])
    first, again = (model.client.request("generate", image=str(image), prompt=prompt, max_new_tokens=max_new_tokens,
                                         num_beams=1, repetition_penalty=1.0) for _ in range(2))
    assert first["ok"] and first["decoding"] == "greedy" and first["token_ids"] == again["token_ids"], first
    assert score["argmax_id"] == first["token_ids"][0]
    return first


def check_decision(result, options: tuple[str, ...] | None = None) -> None:
    """The decoded-answer rule: a deciding first token is the answer, else the parse of the continued text."""
    from verbmirage.models.parsing import decide_choice, decide_yes_no

    decide = decide_yes_no if options is None else (lambda first, text: decide_choice(first, text, options))
    if result.parse_rule == "greedy:first-token":
        assert result.prediction == decide(result.raw_answer, None)[0]
    else:
        assert result.prediction == decide("", result.raw_answer)[0], result


def check_scores(model, images: list[Path], mc_image: Path, options: tuple[str, ...]):
    """Yes/no answers on ``images`` (their p_yes differ: the image reaches the model) and one multiple-choice
    question on ``mc_image``, all scored from logits with the decoded-answer rule; returns the MC result."""
    from verbmirage.benchmark.question_sets import MC_STEM
    from verbmirage.benchmark.sampling import mc_prompt
    from verbmirage.models import Question

    results = model.score_yes_no([Question(str(i), "Is someone riding a horse?", image=p) for i, p in enumerate(images)])
    for result in results:
        assert result.error is None and result.parse_rule.startswith("greedy:")
        assert 0.0 < result.p_yes < 1.0 and 0.0 < result.confidence <= 1.0
        check_decision(result)
    assert results[0].p_yes != results[1].p_yes
    mc = model.score_multiple_choice([Question("m", mc_prompt(MC_STEM, list(options)), image=mc_image,
                                               options=options)])[0]
    assert mc.error is None and sum(mc.option_probs) == pytest.approx(1.0)
    check_decision(mc, options)
    return mc


def check_beam_and_sampling(model, image: Path, prompt: str = YES_NO_PROMPT, beams: bool = True) -> None:
    """Under a beam-5 variant the answer is the checkpoint's own beam search (its chat or README function with
    num_beams=5) and parse_rule names it; under sampling the draw is the question's, the same on every call.
    The scores stay those of the first answer position."""
    from verbmirage.models import Question
    from verbmirage.models.parsing import decide_yes_no
    from verbmirage.variants.settings import Variant

    question = Question("beam", prompt.split("\n")[0], image=image)
    plain = model.score_yes_no([question])[0]
    if beams:
        model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 5, "max_new_tokens": 3}))
        result = model.score_yes_no([question])[0]
        assert result.error is None and result.parse_rule.startswith("beam5:"), result
        ours = model.client.request("generate", image=str(image), prompt=prompt, max_new_tokens=3, num_beams=5,
                                    repetition_penalty=1.0, sampling={"length_penalty": 1.0})
        official = model.client.request("reference", image=str(image), prompt=prompt, max_new_tokens=3, num_beams=5)
        assert ours["ok"] and official["ok"] and ours["decoding"] == "beam5", (ours, official)
        assert ours["text"].startswith(official["text"].strip())  # chat() may drop the last token at the limit
        first = model._token_text(ours["token_ids"][0]) if ours["token_ids"] else ""
        assert result.prediction == decide_yes_no(first, ours["text"], "beam5")[0]
        assert result.p_yes == plain.p_yes and result.yes_margin == plain.yes_margin
    model.use_variant(Variant.from_config({"decoding": "sample", "max_new_tokens": 3, "seed": 1}))
    drawn = [model.score_yes_no([question])[0] for _ in range(2)]
    assert drawn[0] == drawn[1] and drawn[0].parse_rule.startswith("sample:") and drawn[0].error is None
    assert drawn[0].p_yes == plain.p_yes
    model.use_variant(Variant.from_config({}))


#: Yes/no questions of different lengths (the batch tests ask each on every image).
BATCH_QUESTIONS = ("Is someone riding a horse?", "Is it?",
                   "Is a person in a red coat holding an umbrella next to a small dog in the rain?")


def check_batches_equal_one_at_a_time(model, images: list[Path], beams: int | None = 3) -> None:
    """Questions of different lengths on several images (interleaved), scored in batches of at most 2 on each
    image's prefix cache and all at once, equal the same questions one at a time (1e-5 in float32); decoded with
    ``beams`` (greedily where the checkpoint has no beam search) in batches, their texts and tokens equal the
    checkpoint's own one-at-a-time decoding exactly; the adapter's greedy continuations in batches equal its
    one-question calls. The worker's forward counts show that the batched paths ran (one image prefix per image,
    no one-question fallback)."""
    from verbmirage.models import Question

    prompts = [question + "\nAnswer yes or no." for question in BATCH_QUESTIONS]
    items = [{"image": str(image), "prompt": prompt} for prompt in prompts for image in images]
    asked = model._yes_ids + model._no_ids
    alone = [model.client.request("score", token_ids=asked, **item) for item in items]
    assert all(row["ok"] for row in alone), alone
    before = model.client.request("score_batch", items=[], batch_size=2)["forwards"]
    for batch_size in (2, None):
        together = model.client.request("score_batch", items=[{**item, "token_ids": asked} for item in items],
                                        batch_size=batch_size)
        assert together["ok"], together
        for row, single in zip(together["rows"], alone):
            assert "error" not in row, row
            assert row["logits"] == pytest.approx(single["logits"], abs=1e-5)
            assert row["logsumexp"] == pytest.approx(single["logsumexp"], abs=1e-5)
            assert row["argmax_id"] == single["argmax_id"]
    after = together["forwards"]
    assert after["prefix"] - before["prefix"] == 2 * len(images)  # one image prefix per image and call
    # rows batched: fewer suffix forwards than rows (cut by length); at most 2 rows a forward: 2 or more for 3
    assert 3 * len(images) <= after["suffix"] - before["suffix"] <= 4 * len(images) < 2 * len(items), (before, after)
    assert after["single"] == before["single"]
    # (greedy decoding's batches are the adapter's below: the same generate_batch, one beam; CI time)
    for num_beams in (beams or 1,):
        alone = [model.client.request("generate", max_new_tokens=4, num_beams=num_beams, repetition_penalty=1.0,
                                      **item) for item in items]
        together = model.client.request("generate_batch", items=items, max_new_tokens=4, num_beams=num_beams,
                                        repetition_penalty=1.0, batch_size=4)
        assert together["ok"] and together["forwards"]["single"] == after["single"], together
        for reply, single in zip(together["replies"], alone):
            assert single["ok"] and "error" not in reply, (reply, single)
            assert (reply["text"], reply["token_ids"], reply["decoding"]) == \
                (single["text"], single["token_ids"], single["decoding"])
    # the adapter: a call of several questions (the job's batch size caps a forward) answers as one at a time
    questions = [Question(f"{i}", item["prompt"].split("\n")[0], image=Path(item["image"]))
                 for i, item in enumerate(items)]
    # 4 new tokens, as above: further on, a random tiny model's logits come within 1e-4 of a tie (seen on
    # MiniCPM's 6th token), which any other order of float sums may break the other way
    model.use_batch_size(4)
    continue_tokens, model.continue_tokens = model.continue_tokens, 4
    try:
        batched = model.score_yes_no(questions)
        singles = [model.score_yes_no([question])[0] for question in questions]
    finally:
        model.continue_tokens = continue_tokens
    for result, single in zip(batched, singles):
        assert result.error is None and (result.prediction, result.raw_answer, result.parse_rule) == \
            (single.prediction, single.raw_answer, single.parse_rule)
        assert result.p_yes == pytest.approx(single.p_yes, abs=1e-5)
        assert result.confidence == pytest.approx(single.confidence, abs=1e-5)


def check_memory_geometry(model, image: Path) -> None:
    """What the driver reports for the batch sizing (``Driver.memory_geometry``) is the checkpoint's own: its
    language model's depth and vocabulary, its float32 width, weights on the device, and an image prefix at least
    as long as a real prompt's (the sizing's prompt, header and suffix included, covers the prompt the driver
    builds)."""
    import json

    from verbmirage.models.memory import HEADER_TOKENS, SUFFIX_TOKENS

    geometry = model.geometry
    config = json.loads((Path(model.path) / "config.json").read_text())
    text = config.get("text_config") or config
    assert geometry["layers"] == text.get("num_hidden_layers", text.get("n_layers"))
    assert geometry["vocab"] == model.vocab_size and geometry["itemsize"] == 4 and geometry["weights"] > 0
    reply = model.client.request("prompt", image=str(Path(image).resolve()), prompt=YES_NO_PROMPT)
    assert reply["ok"] and len(reply["ids"]) <= geometry["image_tokens"] + HEADER_TOKENS + SUFFIX_TOKENS
    costs = model.memory_costs()
    assert costs.per_row > 0 and costs.per_image > 0 and costs.device == "cpu"
