"""OPERA: over-trust penalty, image reward and retrospection in our own beam loop.

Oracles (docs/variants.md): every token a candidate with penalty weight 0 is plain beam search;
a constructed attention pattern that keeps peaking on one generated column triggers a rollback (first possible
once that column has recurred more than ``threshold`` times), never with a peak before column 10.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from verbmirage.models import create_model
from verbmirage.models.hf.engine import TransformersVLM
from verbmirage.models.hf.on_device import OPERA_ONE_FORWARD_ENV
from verbmirage.models.hf.steppers import InPlaceStepper
from verbmirage.variants import search as decoding
from verbmirage.models.base import Question
from verbmirage.variants.settings import OperaSettings, Variant

VOCAB, PROMPT, STOP = 7, 6, {6}


class ToyStepper:
    """Logits from a fixed table by the last token (and the length); attention rows chosen by the test.

    ``peak``: the generated column every generated query attends to most once it exists (None: itself).
    """

    def __init__(self, rows: int, peak: int | None = None, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(VOCAB, VOCAB, generator=generator) * 2
        self.table[:, 6] = -50.0  # the stop token never wins: answers run to max_new_tokens
        self.peak = peak
        self.last = torch.zeros(rows, dtype=torch.long)
        self.length = PROMPT
        self.first = self.table[0].repeat(rows, 1)

    def _row(self, rows: int) -> torch.Tensor:
        keys = self.length
        row = torch.full((rows, keys), 0.1 / keys)
        generated = keys - PROMPT - 1  # the fed token's own generated column
        target = PROMPT + self.peak if self.peak is not None and generated >= self.peak else keys - 1
        row[:, target] += 0.9
        return row

    def advance(self, tokens):
        self.last = tokens.clone()
        self.length += 1
        self.attention = self._row(len(tokens))
        return self.table[tokens] + 0.01 * self.length

    def probe(self, candidates):
        rows = []
        for column in range(candidates.shape[1]):
            self.length += 1
            rows.append(self._row(candidates.shape[0]))
            self.length -= 1
        return torch.stack(rows, dim=1)

    def reorder(self, rows):
        self.last = self.last[rows]


def test_column_scores_on_a_hand_made_window():
    window = torch.tensor([[0.5, 0.0, 0.0], [0.2, 0.4, 0.0], [0.1, 0.3, 0.6]])
    scores = decoding.column_scores(window, 50.0, float16=False)
    expected = [1e-7 * (25 * 10 * 5), 1e-7 * (20 * 15), 1e-7 * 30]
    assert scores.tolist() == pytest.approx(expected, rel=1e-5)
    # the official float16 storage: a long product of large entries overflows to inf
    long = torch.tril(torch.full((12, 12), 0.9))
    assert math.isinf(float(decoding.column_scores(long, 50.0, float16=True)[0]))
    assert math.isfinite(float(decoding.column_scores(long, 50.0, float16=False)[0]))
    assert scores.dtype == torch.float32


def test_every_token_a_candidate_without_penalty_is_beam_search():
    settings = OperaSettings(num_attn_candidates=VOCAB, penalty_weights=0.0, threshold=10**6,
                             full_length_normalisation=False)
    for seed in range(3):
        plain = decoding.beam_search(ToyStepper(3, seed=seed).first, ToyStepper(3, seed=seed), 3, 8, STOP)
        decoded, rollbacks = decoding.opera_search(ToyStepper(3, seed=seed).first, ToyStepper(3, seed=seed),
                                                   settings, 3, 8, STOP, (1, 4), PROMPT,
                                                   lambda: ToyStepper(3, seed=seed))
        assert decoded == plain and rollbacks == []  # the tokens and the first token's probability


def test_fewer_candidates_and_the_image_reward_change_the_ranking_only_through_candidates():
    # with C < V the step's distribution is renormalised over the candidates: tokens outside never appear
    settings = OperaSettings(num_attn_candidates=2, penalty_weights=1.0, threshold=10**6)
    decoded, _ = decoding.opera_search(ToyStepper(3).first, ToyStepper(3), settings, 3, 6, STOP, (1, 4), PROMPT,
                                       lambda: ToyStepper(3))
    table = ToyStepper(3).table
    last = 0
    for token in decoded.tokens[0]:  # each chosen token is among the top-2 raw logits after the previous one
        assert token in table[last].topk(2).indices.tolist()
        last = token
    # the first token's probability is the first step's over its two candidates (their image rewards are equal
    # here: each probe row puts 0.1 / 7 on every key), not the whole vocabulary's softmax
    top = table[0].topk(2)
    over_candidates = dict(zip(top.indices.tolist(), torch.softmax(top.values.double(), dim=0).tolist()))
    first = decoded.tokens[0][0]
    assert decoded.first_probability == [pytest.approx(over_candidates[first], rel=1e-5)]
    assert over_candidates[first] > float(torch.softmax(table[0].double(), dim=0)[first]) + 1e-3


def test_a_recurring_over_trust_column_triggers_rollback():
    # scale 1 in float32: the column products stay finite and non-zero (with the official 50 this extreme pattern's
    # products overflow and the penalty swamps every candidate, and float16 would round scale 1's to 0; the
    # retrospection below depends only on which column wins)
    settings = OperaSettings(threshold=15, num_attn_candidates=3, scale_factor=1.0, float16_scores=False)
    stepper = ToyStepper(2, peak=10)
    decoded, rollbacks = decoding.opera_search(stepper.first, stepper, settings, 2, 32, STOP, (1, 4), PROMPT,
                                               lambda: ToyStepper(2, peak=10))
    assert rollbacks, "column 10 kept the over-trust peak for more than 15 steps: OPERA must roll back"
    first_step, target = rollbacks[0]
    assert target == 11 and first_step >= 25  # more than 15 occurrences of column 10 from step 10 on
    # each position is revisited at most num_attn_candidates times, then the one before, then never
    assert sum(1 for _, t in rollbacks if t == 11) <= 3 and sum(1 for _, t in rollbacks if t == 10) <= 3
    assert len(decoded.tokens[0]) == 32
    # a peak before column 10, or answers of at most 25 tokens, never roll back
    _, early = decoding.opera_search(ToyStepper(2, peak=5).first, ToyStepper(2, peak=5), settings, 2, 32, STOP,
                                     (1, 4), PROMPT, lambda: ToyStepper(2, peak=5))
    _, short = decoding.opera_search(ToyStepper(2, peak=10).first, ToyStepper(2, peak=10), settings, 2, 25, STOP,
                                     (1, 4), PROMPT, lambda: ToyStepper(2, peak=10))
    assert early == [] and short == []


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("opera") / "scene.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(path)
    return path


class TopCandidates:
    """A stepper whose logits keep only each row's top-C raw logits (-999 elsewhere): OPERA's step without penalty."""

    def __init__(self, inner, count):
        self.inner, self.count = inner, count
        self.first = self.mask(inner.first)

    def mask(self, logits):
        top = logits.float().topk(self.count, dim=-1)
        return torch.full_like(logits.float(), -999.0).scatter(-1, top.indices, top.values)

    def advance(self, tokens):
        return self.mask(self.inner.advance(tokens))

    def reorder(self, rows):
        self.inner.reorder(rows)


def force_one_forward(monkeypatch, on: bool = True) -> None:
    """OPERA's step in one forward (the candidates' forward also feeds the chosen one), as on CUDA
    (hf/on_device.py), or in the CPU's two: for every engine made after this."""
    monkeypatch.setattr(TransformersVLM, "opera_one_forward", on)


def assert_beam_search_over_top_candidates(model, question: Question) -> None:
    """Penalty weight 0, OPERA's answer to ``question`` is beam search over each beam's top-C tokens."""
    text, image = model.render(question, False), model.open_image(question.image)
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 3, "max_new_tokens": 4}))
    first, stepper = model.decoder.open_stepper([(question.image, image, text)], 3, model.strategy)
    masked = TopCandidates(stepper, 3)
    expected = decoding.beam_search(masked.first, masked, 3, 4, model.stop_tokens()).tokens[0]
    model.use_variant(Variant.from_config({
        "decoding": "opera", "num_beams": 3, "max_new_tokens": 4,
        "opera": {"num_attn_candidates": 3, "penalty_weights": 0.0, "threshold": 10**6,
                  "full_length_normalisation": False}}))
    (answer,) = model.decode_answers([question], False)
    assert answer.text == model.tokenizer.decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("family, one_forward", [("llava", False), ("llava", True), ("qwen2_vl", False),
                                                 ("instructblip", False)])
def test_opera_on_the_tiny_models(tiny_dirs, picture, family, one_forward, monkeypatch):
    """Penalty weight 0: OPERA is beam search over each beam's top-C tokens (notes: not plain beam search,
    the renormalisation over candidates changes the ranking across beams); the candidate probes (fed, read,
    undone) leave the cache as it was, or later steps would differ. LLaVA also with CUDA's one forward per step."""
    force_one_forward(monkeypatch, one_forward)
    model = create_model("tiny", {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
    questions = [Question("q0", "Is the person riding the horse?", picture)]
    assert_beam_search_over_top_candidates(model, questions[0])
    if family == "llava":  # the attention that reads prefixes in place gives the rows: no eager kernel, no hook
        assert not model.last_attention.kept and model.prefix_cache.reads_in_place()
    else:
        assert model.last_attention.row.shape[0] == 3  # the last layer's rows were read (eager attention)
    model.use_variant(Variant.from_config({"decoding": "opera", "max_new_tokens": 3}))
    (result,) = model.score_yes_no(questions)
    assert result.parse_rule.startswith("opera:") and result.prediction in ("yes", "no", "unknown")


class Stacked:
    """Several questions' toy steppers as one batch (``k`` rows each, question-major), like the engine's rows; a
    question's rows leave it whole (its answer ended), and ``fed`` / ``probed`` record the rows of each step."""

    def __init__(self, parts, k):
        self.parts, self.k, self.fed, self.probed = list(parts), k, [], []
        self.first = torch.cat([part.first for part in parts])

    def _split(self, values):
        return [values[i * self.k : (i + 1) * self.k] for i in range(len(self.parts))]

    def advance(self, tokens):
        self.fed.append(len(tokens))
        logits = torch.cat([part.advance(t) for part, t in zip(self.parts, self._split(tokens))])
        self.attention = torch.cat([part.attention for part in self.parts])
        return logits

    def probe(self, candidates):
        self.probed.append(len(candidates))
        return torch.cat([part.probe(c) for part, c in zip(self.parts, self._split(candidates))])

    def reorder(self, rows):
        parts = []
        for own in rows.view(-1, self.k):
            group = int(own[0]) // self.k
            assert bool((own // self.k == group).all())  # beams stay in their question
            self.parts[group].reorder(own - group * self.k)
            parts.append(self.parts[group])
        self.parts = parts


def test_a_batch_of_questions_decodes_each_as_alone():
    """opera_batch == opera_search per question (different logits, a question that stops early), and a question
    whose retrospection would roll back is left to opera_search (None) without changing the others, its beams
    leaving the batch's stepper."""
    settings = OperaSettings(num_attn_candidates=3, reward_tokens=3, scale_factor=1.0, float16_scores=False)
    for length in (6, 12):
        alone = [decoding.opera_search(ToyStepper(2, seed=s).first, ToyStepper(2, seed=s), settings, 2, length,
                                       STOP, (1, 4), PROMPT, lambda: None)[0] for s in range(3)]
        batch = Stacked([ToyStepper(2, seed=s) for s in range(3)], 2)
        assert decoding.opera_batch(batch.first, batch, settings, 2, length, STOP, (1, 4), PROMPT,
                                    [PROMPT] * 3) == alone
    settings = OperaSettings(threshold=15, num_attn_candidates=3, scale_factor=1.0, float16_scores=False)
    batch = Stacked([ToyStepper(2, peak=10), ToyStepper(2, seed=1)], 2)
    plain = decoding.opera_search(ToyStepper(2, seed=1).first, ToyStepper(2, seed=1), settings, 2, 32, STOP, (1, 4),
                                  PROMPT, lambda: None)[0]
    assert decoding.opera_batch(batch.first, batch, settings, 2, 32, STOP, (1, 4), PROMPT, [PROMPT] * 2) == \
        [None, plain]
    assert batch.fed[0] == 4 and batch.fed[-1] == batch.probed[-1] == 2  # the question left to opera_search left


@pytest.mark.parametrize("family, one_forward", [("llava", False), ("llava", True), ("qwen2_vl", False),
                                                 ("instructblip", False)])
def test_batched_opera_equals_one_question_at_a_time(tiny_dirs, picture, family, one_forward, tmp_path,
                                                     monkeypatch):
    """The engine's OPERA over questions of several lengths and images (LLaVA: across images, left-padded; Qwen
    per image; InstructBLIP per image and prompt length) decodes what each question decodes alone, penalty on.
    LLaVA also with CUDA's one forward per step."""
    force_one_forward(monkeypatch, one_forward)
    model = create_model("tiny", {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
    batches = []
    real = decoding.opera_batch
    monkeypatch.setattr(decoding, "opera_batch", lambda first, *args: batches.append(first.shape[0]) or
                        real(first, *args))
    other = tmp_path / "other.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(other)
    prompts = ["Is the person riding the horse?", "Is the person eating a cake next to the table near the horse?",
               "Is someone washing it?", "Is the person holding the cup?"]
    questions = [Question(f"q{i}", prompts[i % 4], picture if i >= 4 else other) for i in range(8)]
    for full_length in (True, False):
        model.use_variant(Variant.from_config({
            "decoding": "opera", "num_beams": 2, "max_new_tokens": 5,
            "opera": {"num_attn_candidates": 3, "reward_tokens": 2, "full_length_normalisation": full_length}}))
        batches.clear()
        together = model.decode_answers(questions, False)
        # beams hold rows: at most (questions of the call / beams) questions per batch, 2 beams each, where each
        # row holds a copy of its prefix; LLaVA's rows read theirs in place, so the call decodes as one
        expected = {"llava": [16], "qwen2_vl": [8, 8], "instructblip": [4, 4]}[family]  # IB: two equal lengths
        assert batches == expected
        alone = [model.decode_answers([q], False)[0] for q in questions]  # one question: opera_search
        assert batches == expected
        assert [answer[:2] for answer in together] == [answer[:2] for answer in alone], (family, full_length)
        assert [answer.probability for answer in together] == pytest.approx(
            [answer.probability for answer in alone], rel=1e-5)  # one forward of several rows rounds apart


@pytest.mark.parametrize("batch", [1, 2])
def test_full_length_normalisation_counts_the_image_as_one_placeholder(tiny_dirs, picture, monkeypatch, batch):
    """The official OPERA LLaVA wrapper's prompt holds the image as one placeholder token: the length it
    normalises by is the unexpanded prompt's, len(tokenizer(prompt)), not the 576-token (here: the tiny model's)
    expansion."""
    model = create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    model.use_variant(Variant.from_config({"decoding": "opera", "num_beams": 2, "max_new_tokens": 2,
                                           "opera": {"num_attn_candidates": 2}}))
    questions = [Question(f"q{i}", f"Is the person {verb} the horse?", picture)
                 for i, verb in enumerate(["riding", "feeding"][:batch])]
    seen = []
    search, batched = decoding.opera_search, decoding.opera_batch
    monkeypatch.setattr(decoding, "opera_search", lambda *args, **kwargs: (
        seen.append(kwargs["normalised_length"]), search(*args, **kwargs))[1])
    monkeypatch.setattr(decoding, "opera_batch", lambda *args, **kwargs: (
        seen.extend(args[8]), batched(*args, **kwargs))[1])
    model.decode_answers(questions, False)
    expected = [len(model.tokenizer(model.render(q, False)).input_ids) for q in questions]
    assert seen == expected and model.image_token_id() in model.tokenizer(model.render(questions[0], False)).input_ids


def test_each_questions_image_span_and_length_are_read_on_the_host(tiny_dirs, picture):
    """OPERA reads each question's image positions and prompt length before it decodes: from the token ids on the
    host, as the device would have them (on a GPU a copy to it and reads back per question would each wait)."""
    model = create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    image = model.open_image(picture)
    text = model.render(Question("q", "Is the person riding the horse?", picture), False)
    encoded = model.encode_shared_image([text], image)  # as the scoring pass does first
    on_device = torch.nonzero(encoded["input_ids"][0] == model.image_token_id()).flatten()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        span, ids = model.decoder.image_span(image, text), model.prompt_ids(text, image)
    assert [event.name for event in profile.events() if event.name.startswith("aten::")] == []
    assert span == (int(on_device[0]), int(on_device[-1])) and span[1] > span[0]
    assert ids.tolist() == encoded["input_ids"][0, : int(encoded["attention_mask"][0].sum())].tolist()


def test_full_length_normalisation_counts_the_image_once_in_a_batch(tiny_dirs, picture, monkeypatch):
    """The same offset when questions decode together (opera_batch): the 4 questions of a call in one batch
    (prefixes read in place), or 2 beams holding 2 questions per batch (a copy of the prefix per row)."""
    model = create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    model.use_variant(Variant.from_config({"decoding": "opera", "num_beams": 2, "max_new_tokens": 2,
                                           "opera": {"num_attn_candidates": 2}}))
    prompts = ["Is the person riding the horse?", "Is someone washing it near the table?"]
    questions = [Question(f"q{i}", prompts[i % 2], picture) for i in range(4)]
    seen = []
    batched = decoding.opera_batch
    monkeypatch.setattr(decoding, "opera_batch", lambda *args, **kwargs: (
        seen.append(list(args[8])), batched(*args, **kwargs))[1])
    expected = [len(model.tokenizer(model.render(q, False)).input_ids) for q in questions]
    model.decode_answers(questions, False)
    assert len(seen) == 1 and sorted(seen[0]) == sorted(expected)
    seen.clear()
    model.shared_prefix_attention = False
    model.decode_answers(questions, False)
    assert len(seen) == 2 and sorted(sum(seen, [])) == sorted(expected)


def test_attention_rows_read_in_place_equal_eager_attention_on_copied_prefixes(tiny_dirs, picture):
    """OPERA on LLaVA takes the last layer's attention from the attention that reads prefixes in place: each fed
    token's row and each probed candidate's row (all candidates in one forward) equal eager attention's rows on
    a copy of the prefix per row (left-padded there, right-padded here: compared on each row's real columns),
    and the probes change no later step."""
    from verbmirage.models.hf.steppers import AttendingStepper, InPlaceStepper

    models = [create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
              for _ in range(2)]
    in_place, eager = models
    eager.shared_prefix_attention = False
    eager.keep_last_attention()
    image = in_place.open_image(picture)
    texts = [m.render(Question("q", prompt, picture), False) for m, prompt in
             zip(models, ["Is the person riding the horse?", "Is someone washing the horse near the table?"])]
    items = [(picture, image, text) for text in texts]
    first, ours = in_place.decoder.open_stepper(items, 2, in_place.strategy)
    assert isinstance(ours, InPlaceStepper)
    ours.records_attention = True
    eager_first, inner = eager.decoder.open_stepper([(picture, eager.open_image(picture), text) for text in texts], 2,
                                                 eager.strategy)
    theirs = AttendingStepper(eager, inner, eager_first)
    torch.testing.assert_close(first, eager_first, atol=1e-5, rtol=1e-5)
    assert len(set(ours.prompt_lengths)) == 2  # prompts of two lengths: padding in both layouts
    prefix = ours.prompt_columns - ours.used  # the prefix's columns (one length here)

    def real(row_weights, stepper_row, own_first):
        """A row's weights on its real columns: the prefix, its prompt's own tokens, then everything after."""
        length = ours.prompt_lengths[stepper_row] - prefix
        return torch.cat([row_weights[:prefix], row_weights[own_first(length) : own_first(length) + length],
                          row_weights[ours.prompt_columns:]])

    own_width = ours.prompt_columns - prefix
    tokens = torch.tensor([5, 9, 5, 9])
    for step in range(3):
        candidates = torch.tensor([[3, 7, 11]] * 4) + step
        probed, probed_eager = ours.probe(candidates), theirs.probe(candidates)
        logits, logits_eager = ours.advance(tokens + step), theirs.advance(tokens + step)
        torch.testing.assert_close(logits, logits_eager, atol=1e-5, rtol=1e-5)
        for row in range(4):
            for mine, other in [(ours.attention[row], theirs.attention[row])] + \
                    [(probed[row, c], probed_eager[row, c]) for c in range(3)]:
                torch.testing.assert_close(real(mine, row, lambda n: prefix),
                                           real(other, row, lambda n: prefix + own_width - n), atol=1e-5, rtol=1e-5)
        ours.reorder(torch.tensor([1, 0, 2, 3]))
        theirs.reorder(torch.tensor([1, 0, 2, 3]))


def test_rows_read_in_place_keep_their_attention_when_the_model_turns_eager_mid_call(tiny_dirs, picture):
    """A batch that cannot read its prefixes in place switches the language model to eager attention with a
    hook (keep_last_attention); steppers already open in place go on unchanged (their attention records its own
    weights), while a copying stepper without the hook's rows says what is missing."""
    from verbmirage.models.hf.steppers import AttendingStepper, InPlaceStepper

    def opened(model):
        image = model.open_image(picture)
        texts = [model.render(Question("q", p, picture), False) for p in ["Is the person riding the horse?",
                                                                          "Is someone feeding the horse?"]]
        first, stepper = model.decoder.open_stepper([(picture, image, text) for text in texts], 2, model.strategy)
        assert isinstance(stepper, InPlaceStepper)
        stepper.records_attention = True
        return stepper

    switched, steady = [create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]),
                                              "local_files_only": True}) for _ in range(2)]
    ours, reference = opened(switched), opened(steady)
    tokens = torch.tensor([5, 5, 9, 9])
    ours.advance(tokens), reference.advance(tokens)
    switched.keep_last_attention()
    assert switched.model.config.get_text_config()._attn_implementation == "eager"
    for step in range(2):
        assert torch.equal(ours.advance(tokens + step), reference.advance(tokens + step))
        assert torch.equal(ours.attention, reference.attention)
        assert torch.equal(ours.probe(torch.tensor([[3, 7]] * 4)), reference.probe(torch.tensor([[3, 7]] * 4)))

    steady.shared_prefix_attention = False  # copies its prefixes; no hook keeps attention rows
    image = steady.open_image(picture)
    text = steady.render(Question("q", "Is it?", picture), False)
    first, inner = steady.decoder.open_stepper([(picture, image, text)], 1, steady.strategy)
    with pytest.raises(RuntimeError, match="no attention weights"):
        AttendingStepper(steady, inner, first).advance(torch.tensor([5]))


def _two_images(folder) -> list[Question]:
    other = folder / "other.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(other)
    prompts = ["Is the person riding the horse?", "Is the person eating a cake next to the table near the horse?",
               "Is someone washing it?", "Is the person holding the cup?"]
    return [Question(f"q{i}", prompts[i % 4], folder / "scene.png" if i >= 4 else other) for i in range(8)]


def test_one_forward_per_step_answers_as_two(tiny_dirs, picture, monkeypatch):
    """CUDA's OPERA step (hf/on_device.py), forced on the CPU: the candidates' forward also feeds each beam's
    chosen candidate (its logits, keys, values and attention row), so a step runs one forward, not two, and the
    answers are the two forwards' (tokens equal; probabilities within 1e-5: a token's logits fed beside others
    round apart from its own forward's)."""
    forwards = []
    real = InPlaceStepper._forward
    monkeypatch.setattr(InPlaceStepper, "_forward", lambda self, *args, **kw: forwards.append(1) or real(self, *args, **kw))
    model = create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    assert not model.opera_one_forward  # the CPU's choice
    questions = _two_images(picture.parent)
    model.use_variant(Variant.from_config({"decoding": "opera", "num_beams": 3, "max_new_tokens": 6,
                                           "opera": {"num_attn_candidates": 3, "reward_tokens": 2}}))
    two = model.decode_answers(questions, False)
    two_forwards = len(forwards)
    forwards.clear()
    model.opera_one_forward = True
    one = model.decode_answers(questions, False)
    assert [answer[:2] for answer in one] == [answer[:2] for answer in two]
    assert [answer.probability for answer in one] == pytest.approx([answer.probability for answer in two], rel=1e-5)
    # two forwards per step before (the openings and the last probe aside), about one now
    assert len(forwards) < 0.7 * two_forwards, (len(forwards), two_forwards)


def test_opera_joins_the_rows_of_several_scoring_batches(tiny_dirs, picture, monkeypatch):
    """One OPERA call whose questions the scoring pass cut into several suffix batches (short and long prompts of
    two images: padding the short ones to the long ones' width would cost more than another forward) decodes
    their kept rows joined (``InPlaceStepper.joined``: one prefix length, so the decoded tokens' keys start at one
    attention column in every row): one batch, so a step's forwards serve every question instead of one set per
    scoring batch, and no prompt runs again. The answers are OPERA's one question at a time; a question left to
    decode alone (as a rollback leaves it) opens from its prompt, to the same answer."""
    model = create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    model.use_variant(Variant.from_config({"decoding": "opera", "num_beams": 2, "max_new_tokens": 5,
                                           "opera": {"num_attn_candidates": 3, "reward_tokens": 2}}))
    long = " Look closely at the person, the animals, the objects and the place around them." * 8
    questions = [Question(f"q{i}", text, image) for i, (text, image) in enumerate(
        (text, image) for image in (picture, _two_images(picture.parent)[0].image)
        for text in ("Is the person riding the horse?", "Is someone washing it?",
                     "Is the person riding the horse?" + long, "Is someone washing it?" + long[:-20]))]
    forwards, batches = [], []
    real_forward, real_batch = InPlaceStepper._forward, decoding.opera_batch
    monkeypatch.setattr(InPlaceStepper, "_forward", lambda self, *args, **kw: forwards.append(1) or
                        real_forward(self, *args, **kw))
    monkeypatch.setattr(decoding, "opera_batch", lambda first, *args: batches.append(first.shape[0]) or
                        real_batch(first, *args))

    def decoded(chosen: list[Question], drop: int | None = None):
        """``chosen`` scored and decoded from the scoring call's hand-off: (answers, step forwards, scoring
        batches, the rows the decoding opened from prompts); ``drop``: that question's batched answer is set
        aside (decoded alone, as after a rollback)."""
        handoff = model.answer_logits(chosen, False)[3]
        scoring = len({id(stepper) for stepper, _ in handoff.rows(False).values()})
        forwards.clear()
        if drop is not None:
            monkeypatch.setattr(decoding, "opera_batch", lambda *args: [
                None if i == drop else row for i, row in enumerate(real_batch(*args))])
        opened = []
        real_open = type(model.prefix_cache).open_rows
        monkeypatch.setattr(type(model.prefix_cache), "open_rows", lambda self, items, noised: opened.append(
            len(items)) or real_open(self, items, noised))
        answers = model.decode_answers(chosen, False, handoff)
        monkeypatch.setattr(type(model.prefix_cache), "open_rows", real_open)
        assert not any(handoff.rows(noised) for noised in (False, True))  # every kept row taken
        return answers, len(forwards), scoring, opened

    together, joined_forwards, scoring, opened = decoded(questions)
    assert scoring >= 2 and opened == [] and batches == [2 * len(questions)], (scoring, opened, batches)
    alone = [model.decode_answers([q], False)[0] for q in questions]
    assert [answer[:2] for answer in together] == [answer[:2] for answer in alone]
    assert [answer.probability for answer in together] == pytest.approx([answer.probability for answer in alone],
                                                                         rel=1e-5)
    # each scoring batch's questions decoding by themselves (what the call did before the rows joined)
    handoff = model.answer_logits(questions, False)[3]
    groups: dict[int, list[Question]] = {}
    for question in questions:
        stepper, _ = handoff.rows(False)[question.image, model.render(question, False)]
        groups.setdefault(id(stepper), []).append(question)
    apart = [decoded(group)[1] for group in groups.values()]
    assert len(apart) == scoring and joined_forwards < sum(apart), (joined_forwards, apart)
    # a question the batch leaves to decode alone opens from its prompt (its kept row went into the joined one)
    batches.clear()
    again, _, _, opened = decoded(questions, drop=1)
    assert [answer[:2] for answer in again] == [answer[:2] for answer in together] and opened == [1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_forward_opera_on_cuda_in_float32_is_the_official_rule(tiny_dirs, picture, monkeypatch):
    """On CUDA (float32, eager layers) OPERA runs one forward per step by default; penalty weight 0 it is beam
    search over each beam's top-C tokens (the official rule's candidates), and penalty on it answers as the two
    forwards (``VERBMIRAGE_OPERA_ONE_FORWARD=0``) within float32 rounding."""
    monkeypatch.setenv("VERBMIRAGE_COMPILE_LAYERS", "0")
    settings = {"backend": "llava", "path": str(tiny_dirs["llava"]), "device": "cuda", "dtype": "float32",
                "local_files_only": True}
    model = create_model("tiny", settings)
    assert model.opera_one_forward
    assert_beam_search_over_top_candidates(model, Question("q0", "Is the person riding the horse?", picture))
    questions = _two_images(picture.parent)
    model.use_variant(Variant.from_config({"decoding": "opera", "num_beams": 3, "max_new_tokens": 6,
                                           "opera": {"num_attn_candidates": 3, "reward_tokens": 2}}))
    one = model.decode_answers(questions, False)
    monkeypatch.setenv(OPERA_ONE_FORWARD_ENV, "0")
    two_model = create_model("tiny", settings)
    assert not two_model.opera_one_forward
    two_model.use_variant(model.variant)
    two = two_model.decode_answers(questions, False)
    assert [a[:2] for a in one] == [a[:2] for a in two]
    assert [a.probability for a in one] == pytest.approx([a.probability for a in two], rel=1e-4)
