"""Decoding variants in the engine: greedy, beam, sampling and VCD on the tiny models.

Oracles: our loops produce HF ``generate``'s token sequences (greedy, beam); one beam is greedy; a question's
sample does not depend on its batch; VCD with alpha = 0 and beta = 0, or with the clean image as the noised
one, is the plain model; the same (image, seed) gets the same noise in any batch; a decoding's logits processors
(its hook for a repetition penalty and the like) apply at every step of every decoding, the greedy continuation
included.
"""

from __future__ import annotations

import collections
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from verbmirage.models import create_model
from verbmirage.models.hf.decode import Decoder
from verbmirage.variants import search as decoding
from verbmirage.models.base import Question
from verbmirage.variants.settings import Variant, VCDSettings
from verbmirage.variants.strategies import Greedy
from verbmirage.variants import vcd
from verbmirage.variants.vcd import ContrastiveDecoding


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    base = tmp_path_factory.mktemp("variant_images")
    rng = np.random.default_rng(1)
    paths = []
    for k in range(2):
        path = base / f"img{k}.png"
        Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def yes_no_questions(scene, n=6):
    verbs = ["riding", "holding", "eating the cake near", "washing"]
    return [Question(f"q{i}", f"Is the person {verbs[i % 4]} the horse?", scene[i % 2]) for i in range(n)]


def tiny(tiny_dirs, family):
    return create_model("tiny", {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})


def alike(ours, theirs) -> bool:
    """Decoded answers alike: the same first tokens and texts, and first-token probabilities equal up to float
    rounding (a forward of other rows, or a contrast with itself, rounds apart)."""
    return [answer[:2] for answer in ours] == [answer[:2] for answer in theirs] and [
        answer.probability for answer in ours] == pytest.approx([answer.probability for answer in theirs], rel=1e-5)


def generate_tokens(model, question, multiple_choice=False, **settings) -> list[int]:
    """HF ``generate`` on one whole prompt (no prefix cache, no batch): the new tokens up to a stop token."""
    encoded = model.encode([model.render(question, multiple_choice)], [model.open_image(question.image)])
    output = model.model.generate(**encoded, pad_token_id=model.tokenizer.pad_token_id or 0, **settings)
    prompt = encoded["input_ids"]
    echoed = output.shape[1] >= prompt.shape[1] and torch.equal(output[:, : prompt.shape[1]], prompt)
    tokens = (output[0, prompt.shape[1]:] if echoed else output[0]).tolist()
    stop = model.stop_tokens()
    return tokens[: next((i for i, t in enumerate(tokens) if t in stop), len(tokens))]


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "instructblip"])
def test_greedy_and_beam_equal_generate(tiny_dirs, scene, family):
    model = tiny(tiny_dirs, family)
    questions = yes_no_questions(scene)
    for entry, settings in (
        ({"decoding": "greedy"}, {"do_sample": False, "num_beams": 1}),
        ({"decoding": "beam", "num_beams": 3, "length_penalty": 1.0},
         {"do_sample": False, "num_beams": 3, "length_penalty": 1.0, "early_stopping": False}),
        ({"decoding": "beam", "num_beams": 2, "length_penalty": 0.5},
         {"do_sample": False, "num_beams": 2, "length_penalty": 0.5, "early_stopping": False}),
    ):
        model.use_variant(Variant.from_config({**entry, "max_new_tokens": 6}))
        model.continue_tokens = 5  # greedy decodes continue_tokens + 1
        ours = model.decode_answers(questions, multiple_choice=False)
        for question, (first, text, _) in zip(questions, ours):
            expected = generate_tokens(model, question, max_new_tokens=6, **settings)
            assert text == model.tokenizer.decode(expected, skip_special_tokens=True), (family, entry, question)
            assert first == (expected[0] if expected else None)


def test_one_beam_is_greedy_and_beam_answers_are_parsed(tiny_dirs, scene):
    model = tiny(tiny_dirs, "llava")
    questions = yes_no_questions(scene)
    model.use_variant(Variant.from_config({"decoding": "greedy"}))
    model.continue_tokens = 9
    greedy = model.decode_answers(questions, False)
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 1, "max_new_tokens": 10}))
    assert alike(model.decode_answers(questions, False), greedy)
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 3}))
    results = model.score_yes_no(questions)
    decoded = model.decode_answers(questions, False)
    for result, (_, text, _) in zip(results, decoded):
        assert result.parse_rule.startswith("beam3:")
        assert result.raw_answer in (text, model._token_text(model.tokenizer.encode(text, add_special_tokens=False)[0])
                                     if text else "")


def test_sampling_is_reproducible_across_batches(tiny_dirs, scene):
    model = tiny(tiny_dirs, "llava")
    questions = yes_no_questions(scene, n=6)
    model.use_variant(Variant.from_config({"decoding": "sample", "seed": 3, "max_new_tokens": 6}))
    together = model.decode_answers(questions, False)
    alone = [model.decode_answers([q], False)[0] for q in reversed(questions)][::-1]
    assert alike(together, alone)
    model.use_variant(Variant.from_config({"decoding": "sample", "seed": 4, "max_new_tokens": 6}))
    assert not alike(model.decode_answers(questions, False), together)  # another seed, other draws (6 questions x 6 tokens)
    results = model.score_yes_no(questions)
    assert {r.parse_rule.split(":")[0] for r in results} == {"sample"}


def test_sampling_warpers_and_per_row_generators():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0 + 1e-9]]))

    class Same:
        def advance(self, tokens):
            return logits.repeat(tokens.shape[0], 1)

        def reorder(self, rows):
            pass

    # top_k = 1 is greedy whatever the seed; a token outside top_p never comes
    assert decoding.sample_search(logits.repeat(3, 1), Same(), 4, {99}, [1, 2, 3], top_k=1) == decoding.Decoded(
        [[0] * 4] * 3, [1.0] * 3)  # drawn from the warped distribution: the first token had probability 1 there
    draws = decoding.sample_search(logits.repeat(200, 1), Same(), 3, {99}, list(range(200)), top_p=0.75)
    assert {t for row in draws.tokens for t in row} == {0, 1}
    assert {round(p, 4) for p in draws.first_probability} == {0.625, 0.375}  # 0.5 and 0.3 renormalised


def test_diffusion_noise_matches_the_official_schedule():
    # the official schedule: t=500 -> 0.8630 / 0.5052; t=0 -> 1.0000 / 0.0047; t=999 -> 0.2850 / 0.9585
    for step, (keep, noise) in {500: (0.8630, 0.5052), 0: (1.0000, 0.0047), 999: (0.2850, 0.9585)}.items():
        assert vcd.diffusion_coefficients(step) == pytest.approx((keep, noise), abs=1e-4)
    pixels = torch.randn(2, 3, 8, 8)
    assert torch.equal(vcd.diffuse(pixels, 500, seed=7), vcd.diffuse(pixels, 500, seed=7))
    assert not torch.equal(vcd.diffuse(pixels, 500, seed=7), vcd.diffuse(pixels, 500, seed=8))
    with pytest.raises(ValueError, match="vcd.noise_step"):
        vcd.diffusion_coefficients(1000)


def test_contrast_cut_and_divergence():
    clean = torch.log(torch.tensor([[0.6, 0.25, 0.1, 0.05]]))
    noised = torch.log(torch.tensor([[0.3, 0.4, 0.2, 0.1]]))
    settings = VCDSettings(alpha=1.0, beta=0.2)
    contrasted = vcd.contrast(clean, noised, settings)
    assert torch.isinf(contrasted[0, 2:]).all() and torch.isfinite(contrasted[0, :2]).all()  # p < 0.2 * 0.6 cut
    assert torch.allclose(contrasted[0, :2], 2 * clean[0, :2] - noised[0, :2])
    # a constant added to either logit vector changes no probability
    shifted = vcd.contrast(clean + 3.0, noised - 1.5, settings)
    assert torch.allclose(torch.softmax(shifted, -1), torch.softmax(contrasted, -1))
    kl, kl_reverse, size = vcd.divergence(clean, contrasted, settings.beta)
    q = torch.softmax(contrasted, -1)[0, :2].double()
    p = torch.tensor([0.6, 0.25], dtype=torch.float64) / 0.85
    assert int(size[0]) == 2 and float(kl[0]) == pytest.approx(float((q * (q / p).log()).sum()), rel=1e-6)
    assert float(kl_reverse[0]) == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-6)
    # a one-token plausibility set: KL exactly 0 both ways; alpha = 0 and beta = 0: the plain logits, KL 0
    kl, kl_reverse, size = vcd.divergence(clean, vcd.contrast(clean, noised, VCDSettings(1.0, 0.9)), 0.9)
    assert (float(kl[0]), float(kl_reverse[0]), int(size[0])) == (0.0, 0.0, 1)
    plain = vcd.contrast(clean, noised, VCDSettings(alpha=0.0, beta=0.0))
    assert torch.equal(plain, clean) and [float(v[0]) for v in vcd.divergence(clean, plain, 0.0)[:2]] == [0, 0]


def test_the_stored_kl_direction_and_its_zeros():
    """The documented example (docs/analysis.md, "VCD divergence"): z = [2, 1, -3], z' = [1, 1, -3], alpha 1,
    beta 0.1. We store KL(q || p~) = 0.0671 as vcd_kl and the direction the paper's wording reads,
    KL(p~ || q) = 0.0826, as vcd_kl_reverse. Whichever the direction, a KL is 0 exactly when q = p~, so the
    share of exact zeros does not depend on it."""
    clean, noised = torch.tensor([[2.0, 1.0, -3.0]]), torch.tensor([[1.0, 1.0, -3.0]])
    contrasted = vcd.contrast(clean, noised, VCDSettings(alpha=1.0, beta=0.1))
    kl, kl_reverse, size = vcd.divergence(clean, contrasted, 0.1)
    q = torch.softmax(contrasted.double(), -1)[0, :2]
    p = torch.softmax(clean.double()[0, :2], -1)
    assert int(size[0]) == 2 and float(kl[0]) == pytest.approx(0.0671, abs=5e-5)
    assert float(kl_reverse[0]) == pytest.approx(0.0826, abs=5e-5)
    assert float(kl_reverse[0]) == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-12)
    same = vcd.contrast(clean, clean, VCDSettings(alpha=1.0, beta=0.1))  # no contrast: q = p~
    assert [float(value[0]) for value in vcd.divergence(clean, same, 0.1)[:2]] == [0.0, 0.0]


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "instructblip"])
def test_vcd_oracles_on_the_tiny_models(tiny_dirs, scene, family, monkeypatch):
    model = tiny(tiny_dirs, family)
    questions = yes_no_questions(scene)
    model.use_variant(Variant())
    plain = model.score_yes_no(questions)
    # alpha = 0, beta = 0: exactly the plain scores and answers
    model.use_variant(Variant.from_config({"vcd": {"alpha": 0.0, "beta": 0.0}}))
    neutral = model.score_yes_no(questions)
    for a, b in zip(plain, neutral):
        assert a.p_yes == pytest.approx(b.p_yes, abs=1e-6) and a.prediction == b.prediction
        assert b.vcd_kl == pytest.approx(0.0, abs=1e-9) and b.parse_rule.startswith("greedy+vcd:")
        assert b.vcd_kl_reverse == pytest.approx(0.0, abs=1e-9)
    # the default contrast moves the scores and stores the divergence per question, both directions
    model.use_variant(Variant.from_config({"vcd": {}}))
    contrasted = model.score_yes_no(questions)
    assert all(r.vcd_plausible >= 1 and r.vcd_kl >= 0 and r.vcd_kl_reverse >= 0 for r in contrasted)
    assert any(r.vcd_kl != r.vcd_kl_reverse for r in contrasted if r.vcd_kl > 0) or family == "instructblip"
    encoded = model.encode_shared_image([model.render(questions[0], False)] * 2, model.open_image(scene[0]))
    noised = model.noised_inputs(encoded, scene[0])["pixel_values"]
    assert not torch.allclose(noised, encoded["pixel_values"])  # the noise reaches the pixel tensor ...
    assert torch.equal(noised, model.noised_inputs(encoded, scene[0])["pixel_values"])  # ... the same each time
    if family != "instructblip":  # (the tiny InstructBLIP's answers barely depend on its image: 1e-7)
        assert any(abs(a.p_yes - b.p_yes) > 1e-4 for a, b in zip(plain, contrasted) if not math.isnan(b.p_yes))
    # the same (image, seed): the same noise in any batch
    alone = [model.score_yes_no([q])[0] for q in questions]
    for a, b in zip(contrasted, alone):
        assert (a.vcd_kl, a.prediction) == pytest.approx((b.vcd_kl, b.prediction), abs=1e-5) if isinstance(
            a.vcd_kl, float) else a == b
    # the clean image as the "noised" one (beta = 0): the plain model for any alpha
    monkeypatch.setattr(type(model), "noised_inputs", lambda self, encoded, image_path: encoded)
    model.forget_prefixes()
    model.use_variant(Variant.from_config({"vcd": {"alpha": 1.0, "beta": 0.0}}))
    same = model.score_yes_no(questions)
    for a, b in zip(plain, same):
        assert a.p_yes == pytest.approx(b.p_yes, abs=1e-5) and a.prediction == b.prediction
    # VCD with beam search decodes through both streams: with the clean image as "noised", plain beam search
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 2, "max_new_tokens": 4,
                                           "vcd": {"alpha": 1.0, "beta": 0.0}}))
    with_vcd = model.decode_answers(questions, False)
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 2, "max_new_tokens": 4}))
    assert alike(with_vcd, model.decode_answers(questions, False))


def test_multiple_choice_with_beam_and_vcd(tiny_dirs, scene):
    model = tiny(tiny_dirs, "llava")
    options = ("riding", "holding", "eating", "washing")
    questions = [Question(f"m{i}", "Which action?\nA. riding\nB. holding\nC. eating\nD. washing", scene[i % 2],
                          options) for i in range(3)]
    model.use_variant(Variant.from_config({"decoding": "beam", "vcd": {}, "max_new_tokens": 4}))
    results = model.score_multiple_choice(questions)
    assert all(r.parse_rule.startswith("beam5+vcd:") for r in results)
    assert all(r.prediction in ("A", "B", "C", "D", "unknown") and r.vcd_plausible >= 1 for r in results)
    assert all(sum(r.option_probs) == pytest.approx(1.0) for r in results if not math.isnan(r.option_probs[0]))


@pytest.mark.parametrize("in_place", [True, False])
def test_decoding_holds_at_most_the_calls_rows_and_halves_on_out_of_memory(tiny_dirs, scene, monkeypatch, caplog,
                                                                           in_place):
    """Beams hold rows. With a copy of the prefix per row, a beam-3 call of 6 questions decodes 2 questions (6
    rows) at a time; rows that read their prefix in place hold only their own columns, so all 6 decode at once.
    Out of memory halves that and retries; the answers do not change."""
    model = tiny(tiny_dirs, "llava")
    model.shared_prefix_attention = in_place
    assert model.prefix_cache.reads_in_place() == in_place
    questions = yes_no_questions(scene, n=6)
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 3, "max_new_tokens": 4}))
    opened = []
    real = Decoder.open_stepper
    monkeypatch.setattr(Decoder, "open_stepper", lambda self, items, repeats, *rows:
                        opened.append(len(items)) or real(self, items, repeats, *rows))
    expected = model.decode_answers(questions, False)
    assert opened == ([6] if in_place else [2, 2, 2])

    def tight(self, items, repeats, *rows):  # a device that holds one question's beams
        if len(items) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, items, repeats, *rows)

    monkeypatch.setattr(Decoder, "open_stepper", tight)
    with caplog.at_level("WARNING"):
        assert alike(model.decode_answers(questions, False), expected)
    assert any("batch halved to 1" in record.getMessage() for record in caplog.records)


OPERA = {"decoding": "opera", "num_beams": 2, "max_new_tokens": 3, "opera": {"num_attn_candidates": 2}}


@pytest.mark.parametrize("entry, one_forward", [
    ({"decoding": "greedy"}, False),  # continuations of the answers whose first token decides nothing
    ({"decoding": "beam", "num_beams": 3, "max_new_tokens": 4}, False),
    ({"decoding": "sample", "seed": 2, "max_new_tokens": 4, "vcd": {}}, False),
    (OPERA, False),
    (OPERA, True),  # CUDA's step in one forward (hf/on_device.py), forced on the CPU
], ids=["greedy", "beam", "sample_vcd", "opera", "opera_one_forward"])
def test_decoding_from_the_scoring_pass_equals_opening_the_prompts_again(tiny_dirs, scene, monkeypatch, entry,
                                                                         one_forward):
    """Greedy continuations, beam search, sampling (with VCD) and OPERA start from the scoring pass's rows (kept
    openings) instead of running the prompts again: the same results as without them, YN and MC of both images
    in one call. Suffix batches cut at every length here, so a decoding joins rows of several (OPERA too: its
    rows read their prefixes in place, all of one length)."""
    from verbmirage.models.hf.handoff import Openings
    from verbmirage.models.hf.steppers import InPlaceStepper, PrefixStepper

    model = tiny(tiny_dirs, "llava")
    model.opera_one_forward = one_forward
    model.use_variant(Variant.from_config(entry))
    model.continue_tokens = 4
    model.prefix_cache.BATCH_COST = 0
    joined = []
    for stepper_class in (InPlaceStepper, PrefixStepper):
        monkeypatch.setattr(stepper_class, "joined", classmethod(
            lambda cls, picks, *times, real=stepper_class.joined.__func__: joined.append(len(picks))
            or real(cls, picks, *times)))
    questions = yes_no_questions(scene, n=6) + [
        Question(f"m{i}", f"Which action{' do you see' * (i // 2)}?\nA. riding\nB. holding\nC. eating\nD. washing",
                 scene[i % 2], ("riding", "holding", "eating", "washing")) for i in (2, 0, 3, 1)]  # batches interleaved
    questions.insert(7, replace(questions[6], question_id="m2_again"))  # one prompt asked twice of an image
    flags = [q.options is not None and len(q.options) > 0 for q in questions]
    taken, handed = [], []
    real_take = Openings.take
    monkeypatch.setattr(Openings, "take", lambda self, *args: handed.append(self)
                        or taken.append(real_take(self, *args)) or taken[-1])
    kept = model.score_mixed(questions, flags)
    # decodings started from scoring rows: YN and MC (greedy: the MC answers, whose first token is "No")
    assert sum(stepper is not None for stepper in taken) >= (1 if entry["decoding"] == "greedy" else 2)
    assert len({id(openings) for openings in handed}) == 1  # the call's one hand-off
    if entry["decoding"] != "greedy":  # every question decoded: no kept row is left
        assert not any(handed[0].rows(noised) for noised in (False, True)), handed[0]
    assert len(joined) > 0, joined

    monkeypatch.setattr(Openings, "take", lambda self, *args: None)
    monkeypatch.setattr(Decoder, "kept_opening",
                        lambda self, opened, batch, *rest: model.prefix_cache.suffix_batch(opened, batch))
    model.forget_prefixes()
    again = model.score_mixed(questions, flags)
    for ours, theirs in zip(kept, again):
        assert (ours.prediction, ours.raw_answer, ours.parse_rule) == (theirs.prediction, theirs.raw_answer,
                                                                       theirs.parse_rule)
        for name in ("p_yes", "confidence"):
            if getattr(ours, name, None) is not None:
                assert getattr(ours, name) == pytest.approx(getattr(theirs, name), abs=1e-5, nan_ok=True)


@pytest.mark.parametrize("entry", [
    {"decoding": "beam", "num_beams": 2, "max_new_tokens": 4},
    {"decoding": "sample", "seed": 3, "max_new_tokens": 4, "vcd": {}},  # the noised stream's rows too
])
def test_a_decoding_continues_from_the_hand_off_it_is_given(tiny_dirs, scene, tmp_path, monkeypatch, entry):
    """The scoring call returns what its decoding continues from (``Openings``); the model keeps none of it.
    Scoring another batch in between changes nothing: the first batch decodes from its own hand-off, every row
    taken from it (no prompt opened again), to the answers it decodes right after its own scoring. Without a
    hand-off the decoding opens its rows from the prompts, to the same answers."""
    model = tiny(tiny_dirs, "llava")
    model.use_variant(Variant.from_config(entry))
    first = yes_no_questions(scene, n=4)
    other = Image.fromarray(np.random.default_rng(7).integers(0, 255, (40, 56, 3), dtype=np.uint8))
    other.save(tmp_path / "other.png")
    second = [Question(f"o{i}", f"Is the person {verb} the dog?", tmp_path / "other.png")
              for i, verb in enumerate(("walking", "feeding"))]
    opened = []
    real_open = type(model.prefix_cache).open_rows
    monkeypatch.setattr(type(model.prefix_cache), "open_rows", lambda self, items, noised: opened.append(len(items))
                        or real_open(self, items, noised))

    handoff = model.answer_logits(first, False)[3]
    opened.clear()  # the scoring pass's own
    right_after = model.decode_answers(first, False, handoff)
    assert opened == [], opened  # every row from the hand-off

    model.forget_prefixes()
    handoff = model.answer_logits(first, False)[3]
    assert all(len(handoff.rows(noised)) == len(first) for noised in (False, True)[: 1 + bool(entry.get("vcd"))])
    model.answer_logits(second, False)  # another call in between: its hand-off is its own
    opened.clear()
    assert alike(model.decode_answers(first, False, handoff), right_after)
    assert opened == [], opened
    assert not any(handoff.rows(noised) for noised in (False, True))  # taken: the rows are the decoding's

    without = model.decode_answers(first, False)  # no hand-off: whole prompts, on the image prefixes
    assert opened, "a decoding without a hand-off opens its rows from the prompts"
    assert alike(without, right_after)


@pytest.mark.parametrize("entry", [
    {"decoding": "sample", "seed": 5, "vcd": {}},  # T = 1: the contrast after the cut is what is drawn from
    {"decoding": "sample", "seed": 5, "temperature": 0.5, "vcd": {"alpha": 0.5, "beta": 0.2}},
    {"decoding": "sample", "seed": 5, "temperature": 2.0},
])
def test_the_confidence_is_the_first_tokens_probability_where_sampling_drew_it(tiny_dirs, scene, entry):
    """Against a reference computed here from whole-prompt forwards (docs/models.md: ``confidence`` is the
    probability of the decoded answer's first token): steep logits, YN and MC questions of two images in one
    call; the reference contrasts by hand ((1 + alpha) l - alpha l', tokens under beta x the clean top
    probability cut), divides by the temperature and draws the first token with the question's own generator.
    The first token must be the reference's draw and the confidence its probability there, not the first
    position's score distribution (which at T != 1 is not the one sampled)."""
    from verbmirage.variants.settings import question_seed

    model = tiny(tiny_dirs, "llava")
    with torch.no_grad():
        model.model.get_output_embeddings().weight.mul_(4.0)  # steep: most rows near-certain, a few split
    options = ("riding", "holding", "eating", "washing")
    questions = [Question(f"m{i}", f"Which action{' is it' * (i % 3)}?\n" + "\n".join(
        f"{letter}. {verb}" for letter, verb in zip("ABCD", options[i % 4:] + options[: i % 4])), scene[i % 2],
        options[i % 4:] + options[: i % 4]) for i in range(8)] + yes_no_questions(scene, n=6)
    flags = [bool(q.options) for q in questions]
    variant = Variant.from_config({**entry, "max_new_tokens": 3})
    model.use_variant(variant)
    results = model.score_mixed(questions, flags)
    vcd = variant.vcd
    for question, flag, result in zip(questions, flags, results):
        encoded = model.encode([model.render(question, flag)], [model.open_image(question.image)])
        with torch.no_grad():  # float32, as the engine: a draw near a boundary must fall alike
            clean = model.model(**encoded).logits[0, -1].float()
            logits = clean
            if vcd is not None:
                noised = model.model(**model.noised_inputs(encoded, question.image)).logits[0, -1].float()
                kept = torch.softmax(clean, -1) >= vcd.beta * torch.softmax(clean, -1).max()
                logits = ((1 + vcd.alpha) * clean - vcd.alpha * noised).masked_fill(~kept, -math.inf)
        drawn = torch.softmax(logits / variant.temperature, -1)
        generator = torch.Generator().manual_seed(question_seed(question.question_id, variant.seed))
        first = int(torch.multinomial(drawn, 1, generator=generator)[0])
        (decoded,) = model.decode_answers([question], flag)  # the engine's draw (seeded per question)
        assert decoded.first == (None if first in model.stop_tokens() else first), (question.question_id, entry)
        assert result.confidence == pytest.approx(float(drawn[first]), rel=1e-4), (question.question_id, entry)


# ---- the hook for per-step logit adjustments (Decoding.logits_processors) ---------------------------------------------
# A subclass of a decoding that returns transformers' RepetitionPenaltyLogitsProcessor decodes with the penalty at
# every step, in every decoding and in the engine's greedy continuation of an undecided answer. Oracles: generate with
# the same processor handed the answer's tokens only (generate hands processors the prompt too), for greedy and beam
# search; for the others, a processor that bans a token and records the steps it saw.
PENALTY = 20.0


class OnTheAnswer(LogitsProcessor):
    """``inner`` on the tokens after the prompt: what our decodings hand a processor."""

    def __init__(self, inner, prompt_length: int):
        self.inner, self.prompt_length = inner, prompt_length

    def __call__(self, input_ids, scores):
        return self.inner(input_ids[:, self.prompt_length :], scores)


class Banning:
    """Sets one token's score to -inf and records the answer length of each call."""

    def __init__(self, token: int):
        self.token, self.seen = token, []

    def __call__(self, tokens, scores):
        self.seen.append(tokens.shape[1])
        return scores.index_fill(-1, scores.new_tensor([self.token]).long(), float("-inf"))


def use_processors(model, processors) -> None:
    """The model's strategy replaced by a subclass of its decoding whose hook returns ``processors`` (VCD kept on
    top), as a user's decoding would be written."""
    strategy = model.strategy
    inner = strategy.inner if isinstance(strategy, ContrastiveDecoding) else strategy
    subclass = type(f"Adjusted{type(inner).__name__}", (type(inner),), {"logits_processors": lambda self: processors})
    adjusted = subclass(model.variant)
    model._strategy = ContrastiveDecoding(adjusted) if inner is not strategy else adjusted


def generated_text(model, question, processor, **settings) -> str:
    encoded = model.encode([model.render(question, False)], [model.open_image(question.image)])
    length = encoded["input_ids"].shape[1]
    output = model.model.generate(**encoded, pad_token_id=model.tokenizer.pad_token_id or 0,
                                  logits_processor=LogitsProcessorList([OnTheAnswer(processor, length)]), **settings)
    tokens = output[0, length:].tolist()
    stop = model.stop_tokens()
    return model.tokenizer.decode(tokens[: next((i for i, t in enumerate(tokens) if t in stop), len(tokens))],
                                  skip_special_tokens=True)


@pytest.fixture
def model(tiny_dirs):
    return tiny(tiny_dirs, "llava")


@pytest.fixture
def undecided(model):
    """The model's output layer biased against yes and no: no first token decides an answer, each is continued."""
    head = model.model.get_output_embeddings()
    bias = torch.zeros(head.out_features)
    bias[torch.cat([model._yes_ids, model._no_ids])] = -30.0
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    yield model
    head.bias = None


def test_a_greedy_subclass_with_a_repetition_penalty_continues_undecided_answers_with_it(undecided, scene):
    """The scoring pass's undecided answers are continued by the variant's own decoding (a subclass of ``Greedy``),
    not by plain greedy looked up by name: its penalty shapes the continued text as ``generate`` applies it."""
    model, questions = undecided, yes_no_questions(scene, n=8)
    model.continue_tokens = 6
    model.use_variant(Variant.from_config({}))
    plain = model.score_yes_no(questions)
    processor = RepetitionPenaltyLogitsProcessor(PENALTY)
    use_processors(model, [processor])
    assert isinstance(model.strategy, Greedy) and type(model.strategy) is not Greedy
    penalised = model.score_yes_no(questions)
    continued = [i for i, result in enumerate(penalised) if not result.parse_rule.endswith("first-token")]
    assert continued  # the random tiny model leaves answers undecided
    for i in continued:
        expected = generated_text(model, questions[i], processor, do_sample=False, max_new_tokens=7)
        assert penalised[i].raw_answer == expected, questions[i]
    assert any(penalised[i].raw_answer != plain[i].raw_answer for i in continued)  # the penalty changed answers
    model.use_variant(Variant.from_config({}))


@pytest.mark.parametrize("entry, settings", [
    ({}, {"do_sample": False, "num_beams": 1}),
    ({"decoding": "beam", "num_beams": 3}, {"do_sample": False, "num_beams": 3, "early_stopping": False}),
])
def test_greedy_and_beam_search_with_a_repetition_penalty_equal_generate(model, scene, entry, settings):
    questions = yes_no_questions(scene)
    model.continue_tokens = 5
    model.use_variant(Variant.from_config({**entry, "max_new_tokens": 6} if entry else {}))
    plain = model.decode_answers(questions, False)
    processor = RepetitionPenaltyLogitsProcessor(PENALTY)
    use_processors(model, [processor])
    ours = model.decode_answers(questions, False)
    for question, answer in zip(questions, ours):
        assert answer.text == generated_text(model, question, processor, max_new_tokens=6, **settings), question
    assert [a.text for a in ours] != [a.text for a in plain]
    model.use_variant(Variant.from_config({}))


@pytest.mark.parametrize("entry, one_forward", [
    ({}, False),
    ({"decoding": "beam", "num_beams": 3}, False),
    ({"decoding": "sample", "seed": 2}, False),
    ({"vcd": {}}, False),
    ({"decoding": "sample", "seed": 2, "vcd": {}}, False),
    ({"decoding": "beam", "num_beams": 3, "vcd": {}}, False),
    ({"decoding": "opera", "num_beams": 3}, False),
    ({"decoding": "opera", "num_beams": 3}, True),  # CUDA's step in one forward, forced on the CPU
])
def test_every_decoding_applies_its_processors_at_every_step(model, scene, entry, one_forward, monkeypatch):
    """A processor that bans the token the decoding chose most often: no answer holds it any more, and the
    processor saw every step (answers of 0, 1, ... tokens)."""
    monkeypatch.setattr(model, "opera_one_forward", one_forward)
    questions = yes_no_questions(scene)
    model.continue_tokens = 3
    model.use_variant(Variant.from_config({**entry, "max_new_tokens": 4} if entry.get("decoding") else entry))
    plain = model.decode_answers(questions, False)
    counts = collections.Counter(token for answer in plain for token in model.tokenizer.encode(
        answer.text, add_special_tokens=False))
    banned = counts.most_common(1)[0][0]
    banning = Banning(banned)
    use_processors(model, [banning])
    adjusted = model.decode_answers(questions, False)
    assert all(banned not in model.tokenizer.encode(answer.text, add_special_tokens=False) for answer in adjusted)
    assert set(banning.seen) == set(range(4))
    model.use_variant(Variant.from_config({}))


@pytest.mark.parametrize("settings", [{"decoding": "greedy"}, {"decoding": "beam", "num_beams": 2, "vcd": {}}],
                         ids=["greedy", "vcd_beam"])
def test_qwen_on_whole_prompts_keeps_each_rows_rope_delta_as_rows_move_or_leave(tiny_dirs, scene, settings,
                                                                                monkeypatch):
    """Qwen without prefix reuse decodes from whole prompts, each row's M-RoPE position offset by its rope delta
    from the prompt pass: the delta moves with its row when beams repeat and move, and when answers that ended
    leave the step forwards (the end token made likelier so that they end at different steps); every answer
    equals its question's decoded alone."""
    from verbmirage.models.hf.steppers import FullStepper

    model = create_model("tiny", {"backend": "qwen2_vl", "path": str(tiny_dirs["qwen2_vl"]),
                                  "local_files_only": True, "prefix_reuse": False})
    head = model.model.get_output_embeddings()
    bias = torch.zeros(head.out_features)
    bias[list(model.stop_tokens())] = 0.5
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    questions = yes_no_questions(scene, 8)
    model.use_variant(Variant.from_config({**settings, "max_new_tokens": 6}))
    model.continue_tokens = 6
    left, reorder = [], FullStepper.reorder

    def recording(self, rows):
        left.append(len(rows) < len(self.prompt_lengths))
        reorder(self, rows)

    monkeypatch.setattr(FullStepper, "reorder", recording)
    try:
        together = model.decode_answers(questions, False)
        assert any(left) or settings.get("decoding") == "beam"  # answers ended apart and left
        alone = [model.decode_answers([question], False)[0] for question in questions]
    finally:
        head.bias = None
    assert alike(together, alone)
    assert any(len(answer[1]) > 0 for answer in together)
