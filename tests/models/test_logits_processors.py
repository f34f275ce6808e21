"""The decodings' hook for per-step logit adjustments (``Decoding.logits_processors``, variants/strategies.py): a
subclass of a decoding that returns transformers' ``RepetitionPenaltyLogitsProcessor`` decodes with the penalty at
every step, in every decoding and in the engine's greedy continuation of an undecided answer.

Oracles: transformers ``generate`` with the same processor, handed the answer's tokens only (generate hands
processors the prompt too), for greedy and beam search; for the others, a processor that bans a token and
records the steps it saw."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from verbmirage.models import create_model
from verbmirage.models.base import Question
from verbmirage.variants.settings import Variant
from verbmirage.variants.strategies import Greedy
from verbmirage.variants.vcd import ContrastiveDecoding

PENALTY = 20.0


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    base = tmp_path_factory.mktemp("processor_images")
    rng = np.random.default_rng(5)
    paths = []
    for k in range(2):
        path = base / f"img{k}.png"
        Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def questions_on(scene, n=8):
    verbs = ["riding", "holding", "eating the cake near", "washing"]
    return [Question(f"q{i}", f"Is the person {verbs[i % 4]} the horse?", scene[i % 2]) for i in range(n)]


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
    stop = model._stop_tokens()
    return model.tokenizer.decode(tokens[: next((i for i, t in enumerate(tokens) if t in stop), len(tokens))],
                                  skip_special_tokens=True)


@pytest.fixture(scope="module")
def model(tiny_dirs):
    return create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})


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
    model, questions = undecided, questions_on(scene)
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
    questions = questions_on(scene, 6)
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


@pytest.mark.parametrize("entry", [
    {},
    {"decoding": "beam", "num_beams": 3},
    {"decoding": "sample", "seed": 2},
    {"vcd": {}},
    {"decoding": "sample", "seed": 2, "vcd": {}},
    {"decoding": "beam", "num_beams": 3, "vcd": {}},
    {"decoding": "opera", "num_beams": 3},
])
def test_every_decoding_applies_its_processors_at_every_step(model, scene, entry):
    """A processor that bans the token the decoding chose most often: no answer holds it any more, and the
    processor saw every step (answers of 0, 1, ... tokens)."""
    questions = questions_on(scene, 6)
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
