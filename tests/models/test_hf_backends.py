"""Transformers backends on tiny random-weight models of the real classes.

The property that matters: batched scoring with prefix reuse gives the same
P(yes) and option probabilities as one unbatched full forward pass per question.
"""

from __future__ import annotations

from collections import Counter

import logging
import math

import numpy as np
import pytest
import torch

from verbmirage.models import Question, create_model
from verbmirage.models.parsing import decide_choice, decide_yes_no
from verbmirage.benchmark.questions import QuestionSettings, build_question_set
from verbmirage.models.registry import BACKENDS, TINY_FAMILIES

TOLERANCE = 1e-4
# instructblip, llava, qwen2_5_vl, qwen2_vl: the transformers families with a tiny model
FAMILIES = sorted(f for f in TINY_FAMILIES if BACKENDS[f].kind == "transformers")


@pytest.fixture(scope="session")
def tiny_llava(tiny_dirs):
    return tiny_dirs["llava"]


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    return {
        family: create_model(family, {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
        for family in FAMILIES
    }


def _vision_tower(model):
    for owner in (model, getattr(model, "model", None)):
        for name in ("vision_tower", "visual", "vision_model"):
            if owner is not None and hasattr(owner, name):
                return getattr(owner, name)
    raise AttributeError("no vision tower found")


def _questions(demo_anno, images, qset, n):
    table = build_question_set(demo_anno, qset, QuestionSettings()).head(n)
    mapping = {image: images[i % len(images)] for i, image in enumerate(sorted(set(table.image)))}
    return [
        Question(row.question_id, row.prompt, image=mapping[row.image], options=tuple(row.options))
        for row in table.itertuples()
    ]


def _reference(model, question: Question, multiple_choice: bool) -> torch.Tensor:
    """One question alone, the whole prompt through the model: softmax at the last position."""
    encoded = model.encode([model.render(question, multiple_choice)], [model.open_image(question.image)])
    with torch.inference_mode():
        logits = model.model(**encoded).logits[0, -1].float()
    return torch.softmax(logits, dim=-1)


@pytest.fixture(scope="module")
def llava(tiny_models):
    return tiny_models["llava"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prefix_reuse", [True, False])
def test_yes_no_equals_unbatched_forward(tiny_models, family, demo_anno, images, prefix_reuse):
    model = tiny_models[family]
    model.prefix_reuse = prefix_reuse and model.supports_prefix_reuse
    model.forget_prefixes()
    questions = _questions(demo_anno, images, "yn_obj", 24)
    results = model.score_yes_no(questions)
    for question, result in zip(questions, results):
        probs = _reference(model, question, False)
        yes, no = probs[model._yes_ids].sum(), probs[model._no_ids].sum()
        assert result.p_yes == pytest.approx(float(yes / (yes + no)), abs=TOLERANCE)
        assert result.confidence == pytest.approx(float(probs.max()), abs=TOLERANCE)
        _check_decision(result, model.tokenizer.decode([int(probs.argmax())]), decide_yes_no)
    model.prefix_reuse = model.supports_prefix_reuse


def _check_decision(result, first: str, decide) -> None:
    """The answer is the reference argmax token when it decides, else the parse of a continuation starting with it."""
    prediction, _, rule = decide(first, None)
    if rule == "greedy:first-token" and prediction != "unknown":
        assert (result.raw_answer, result.prediction, result.parse_rule) == (first, prediction, rule)
    else:
        assert result.raw_answer.lstrip().startswith(first.strip()), (result.raw_answer, first)
        assert result.prediction == decide(first, result.raw_answer)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_multiple_choice_rotations_equal_unbatched_forward(tiny_models, family, demo_anno, images):
    model = tiny_models[family]
    questions = _questions(demo_anno, images, "mc_obj", 16)  # four groups of four rotations
    for question, result in zip(questions, model.score_multiple_choice(questions)):
        probs = _reference(model, question, True)
        mass = np.array([float(probs[model._letter_ids[k]].sum()) for k in range(4)])
        assert result.option_probs == pytest.approx(tuple(mass / mass.sum()), abs=TOLERANCE)
        _check_decision(result, model.tokenizer.decode([int(probs.argmax())]),
                        lambda first, text: decide_choice(first, text, question.options))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "instructblip"])
def test_prefix_reuse_embeds_each_image_once(tiny_models, family, demo_anno, images):
    """With reuse the language model embeds every image's shared prefix once, not once per question."""
    model = tiny_models[family]
    embedded, vision_calls = [], []
    hooks = [
        model.model.get_input_embeddings().register_forward_hook(lambda m, args, out: embedded.append(args[0].numel())),
        # images through the vision tower: a family whose images batch across prompts (LLaVA's) embeds the images
        # of a call as one batch, Qwen one per call
        _vision_tower(model.model).register_forward_hook(
            lambda m, args, out: vision_calls.append(args[0].shape[0] if model.cross_image_batches else 1)),
    ]
    questions = _questions(demo_anno, images, "yn_obj", 30)
    model.continue_tokens = 0  # the scoring pass only
    try:
        counts = {}
        for reuse in (True, False):
            embedded.clear(), vision_calls.clear()
            model.prefix_reuse = reuse
            model.forget_prefixes()
            model.score_yes_no(questions)
            counts[reuse] = (sum(embedded), sum(vision_calls))
    finally:
        for hook in hooks:
            hook.remove()
        model.prefix_reuse, model.continue_tokens = True, type(model).continue_tokens
    distinct = len({q.image for q in questions})
    assert counts[True][1] == distinct  # the vision tower runs once per image
    # the prefix (template and image tokens, cut after the last image token) is embedded once per image,
    # so reuse saves (questions on the image - 1) x its length; padding of the batches costs a little back
    prefix = {}
    for q in questions:
        ids = model.encode([model.render(q, False)], [model.open_image(q.image)])["input_ids"][0]
        prefix[q.image] = model.prefix_cache._last_image_token(ids) + 1
    per_image = Counter(q.image for q in questions)
    saved = sum((n - 1) * prefix[image] for image, n in per_image.items())
    assert counts[True][0] < counts[False][0] - 0.5 * saved, (counts, saved)


def test_bad_images_get_an_error_and_the_rest_goes_on(llava, images, tmp_path):
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"not an image")
    questions = [
        Question("a", "Is someone riding a horse?", image=images[0]),
        Question("b", "Is someone riding a horse?", image=tmp_path / "missing.jpg"),
        Question("c", "Is someone riding a horse?", image=corrupt),
    ]
    results = llava.score_yes_no(questions)
    assert results[0].error is None and 0 <= results[0].p_yes <= 1
    assert "missing.jpg" in results[1].error and "corrupt.jpg" in results[2].error
    assert math.isnan(results[1].p_yes) and results[2].prediction == "unknown"


@pytest.mark.parametrize("variant", [{}, {"decoding": "sample", "vcd": {}, "max_new_tokens": 3}], ids=["greedy", "vcd"])
def test_out_of_memory_halves_the_batch(llava, demo_anno, images, caplog, variant):
    """Out of memory halves the call's batches and drops its kept openings; the answers are those of one call
    (VCD: both streams scored in each halved chunk, then decoded from the prompts)."""
    from verbmirage.variants.settings import Variant

    llava.use_variant(Variant.from_config(variant))
    questions = _questions(demo_anno, images, "yn_obj", 12)
    llava.forget_prefixes()
    expected = [(r.p_yes, r.raw_answer) for r in llava.score_yes_no(questions)]
    real = llava._prefix_logits

    def limited(items, streams=(False,), openings=None):  # a device that fits two prompts at a time
        if len(items) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(items, streams, openings)

    llava._prefix_logits = limited
    try:
        llava.forget_prefixes()
        with caplog.at_level(logging.WARNING):
            got = [(r.p_yes, r.raw_answer) for r in llava.score_yes_no(questions)]
    finally:
        del llava._prefix_logits
        llava.use_variant(Variant())
    assert [p for p, _ in got] == pytest.approx([p for p, _ in expected], abs=TOLERANCE)
    assert [a for _, a in got] == [a for _, a in expected]
    assert any("batch halved" in record.getMessage() for record in caplog.records)


def test_generic_auto_backend_and_bfloat16(tiny_llava, llava, images):
    question = [Question("a", "Is someone riding a horse?", image=images[1])]
    generic = create_model("g", {"backend": "hf", "path": str(tiny_llava), "local_files_only": True})
    assert generic.score_yes_no(question)[0].p_yes == pytest.approx(llava.score_yes_no(question)[0].p_yes, abs=TOLERANCE)
    half = create_model("h", {"backend": "llava", "path": str(tiny_llava), "dtype": "bfloat16", "local_files_only": True})
    assert half.model.dtype == torch.bfloat16
    assert 0.0 <= half.score_yes_no(question)[0].p_yes <= 1.0
    with pytest.raises(ValueError, match="models.x.dtype"):
        create_model("x", {"backend": "llava", "path": str(tiny_llava), "dtype": "float8"})


def test_generate_free_text(llava, images):
    text = llava.generate([Question("a", "Describe the image.", image=images[0])], max_new_tokens=3)
    assert isinstance(text[0], str)


def test_only_the_current_calls_images_keep_their_prefix(llava, demo_anno, images):
    """Prefixes are kept for the decodings of a call and the next call's continuing image, not beyond: a new
    call drops the prefixes (and encodings) of images it does not ask about."""
    questions = _questions(demo_anno, images, "yn_obj", 30)
    first, second = sorted({q.image for q in questions})[:2]
    llava.forget_prefixes()
    llava.score_yes_no([q for q in questions if q.image == first])
    assert {key[0] for key in llava.prefix_cache._prefixes} == {first}
    llava.score_yes_no([q for q in questions if q.image in (first, second)])
    assert {key[0] for key in llava.prefix_cache._prefixes} == {first, second}
    llava.score_yes_no([q for q in questions if q.image == second])
    assert {key[0] for key in llava.prefix_cache._prefixes} == {second} and len(llava.inputs._encoded_images) == 1


@pytest.mark.parametrize("family", ["llava", "instructblip", "qwen2_vl"])
def test_a_call_keeps_what_the_next_needs_in_the_collaborators_not_on_the_engine(tiny_dirs, demo_anno, images,
                                                                                 family):
    """The engine holds its prompt inputs and prefix cache as collaborators (the family's own where it names one):
    what a call keeps for the next (the images and their encodings, the prefixes, the prompts' token ids, the chat
    frame) lives in the collaborator that owns it, and scoring, with its greedy continuations, adds nothing to the
    engine but the variant's strategy. An OPERA call's eager attention and the row its hook keeps live in the
    engine's ``last_attention`` and go when a variant that reads no attention is set: the greedy call after it
    runs the model as loaded, to a fresh model's answers."""
    from verbmirage.models.hf.families import QwenInputs, QwenPrefixes
    from verbmirage.models.hf.tokens import language_attention
    from verbmirage.variants.settings import Variant

    def load():
        loaded = create_model(family, {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
        loaded.continue_tokens = 4
        return loaded

    model = load()
    attention, in_place = language_attention(model.model), model.prefix_cache.reads_in_place()
    before = set(vars(model))
    questions = _questions(demo_anno, images, "yn_obj", 6)
    model.score_yes_no(questions)
    assert set(vars(model)) - before <= {"_strategy"}, set(vars(model)) - before
    greedy = Variant.from_config({"decoding": "greedy", "max_new_tokens": 3})
    fresh = load()
    fresh.use_variant(greedy)
    expected = fresh.decode_answers(questions, False)
    del fresh
    model.use_variant(Variant.from_config({"decoding": "opera", "num_beams": 2, "max_new_tokens": 3}))
    model.decode_answers(questions, False)
    model.keep_last_attention()  # as a decoding whose rows copy their prefix does (LLaVA reads its own in place)
    assert model.last_attention.kept and language_attention(model.model) == "eager"
    model.use_variant(greedy)
    assert not model.last_attention.kept and model.last_attention.row is None
    assert (language_attention(model.model), model.prefix_cache.reads_in_place()) == (attention, in_place)
    assert model.decode_answers(questions, False) == expected
    assert set(vars(model)) - before <= {"_strategy", "variant"}, set(vars(model)) - before
    assert model.inputs._opened and model.inputs._kept_text_ids
    assert bool(model.prefix_cache._prefixes) == (family != "instructblip")  # its Q-Former reads the question
    qwen = family == "qwen2_vl"
    assert isinstance(model.inputs, QwenInputs) == isinstance(model.prefix_cache, QwenPrefixes) == qwen
