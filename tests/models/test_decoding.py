"""Score and decision kept apart: the answer is the decoded text, the scores come from the first answer position."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from verbmirage.models import create_model
from verbmirage.models.base import Question
from verbmirage.models.hf import LogitsVLM
from verbmirage.models.hf.scoring import DecodedAnswer
from verbmirage.models.parsing import decide_choice, decide_yes_no
from verbmirage.variants.settings import Variant
from verbmirage.models.tiny import build_tokenizer


# ---- the decision rule -------------------------------------------------------------------------------
@pytest.mark.parametrize("first, continued, expected", [
    (" Yes", None, ("yes", " Yes", "greedy:first-token")),
    ("No.", "No. The person", ("no", "No.", "greedy:first-token")),
    ("The", "The answer is yes", ("unknown", "The answer is yes", "greedy:unparsed")),
    ("\n", "\nYes, they are", ("yes", "\nYes, they are", "greedy:first-word")),
    ("The", None, ("unknown", "The", "greedy:first-token")),  # a backend that cannot decode further
    ("Yesterday", "Yesterday it", ("unknown", "Yesterday it", "greedy:unparsed")),
])
def test_yes_no_decision(first, continued, expected):
    assert decide_yes_no(first, continued) == expected


@pytest.mark.parametrize("first, continued, expected", [
    ("B", None, ("B", "B", "greedy:first-token")),
    (" C", None, ("C", " C", "greedy:first-token")),
    ("E", "E. none of them", ("unknown", "E. none of them", "greedy:unparsed")),  # not one of the 4 options
    ("A", None, ("A", "A", "greedy:first-token")),
    ("The", "The answer is B.", ("unknown", "The answer is B.", "greedy:unparsed")),
    ("(", "(D) cutting", ("D", "(D) cutting", "greedy:letter")),
    ("An", "A man is riding", ("unknown", "A man is riding", "greedy:unparsed")),
])
def test_choice_decision(first, continued, expected):
    assert decide_choice(first, continued, ("ride", "hold", "eat", "cut")) == expected


# ---- a logit backend with designed first-position distributions -------------------------------------
class DesignedLogits(LogitsVLM):
    """Real tokenizer, logits chosen by the test; ``continuation`` stands in for greedy decoding."""

    backend = "designed"
    uses_images = False

    def __init__(self, logits: torch.Tensor, continuation: list[str] | None):
        super().__init__("designed")
        self.tokenizer = build_tokenizer()
        self._find_answer_tokens()
        self.logits, self.continuation, self.asked = logits, continuation, []

    def answer_logits(self, questions, multiple_choice):
        return self.logits[: len(questions)], [None] * len(questions)

    def continue_answers(self, questions, multiple_choice, openings=None):
        self.asked += [q.question_id for q in questions]
        return None if self.continuation is None else self.continuation[: len(questions)]


def designed(probabilities: dict[str, float]) -> torch.Tensor:
    """Logits over the tiny vocabulary giving each named single-token word its probability (rest spread thin)."""
    tokenizer = build_tokenizer()
    logits = torch.full((len(tokenizer),), -30.0)
    for word, p in probabilities.items():
        (token,) = tokenizer.encode(word, add_special_tokens=False)
        logits[token] = math.log(p)
    return logits


def test_the_decision_is_the_decoded_word_not_the_larger_mass():
    # P("No") = .40, P("Yes") = .30, P("yes") = .15: the model says "No", while yes has more mass (.45 vs .40)
    model = DesignedLogits(designed({"No": 0.40, "Yes": 0.30, "yes": 0.15, "A": 0.15})[None], None)
    (result,) = model.score_yes_no([Question("q", "Is someone riding?")])
    assert result.prediction == "no" and result.raw_answer == "No" and result.parse_rule == "greedy:first-token"
    assert result.p_yes == pytest.approx(0.45 / 0.85, rel=1e-4)  # the score is still the yes share of the mass
    assert result.confidence == pytest.approx(0.40, rel=1e-4)  # probability of the decoded first token ("No")
    assert result.yes_margin == pytest.approx(math.log(0.45 / 0.40), rel=1e-4)
    assert model.asked == []  # the first token decided: nothing decoded further


def test_a_first_token_that_decides_nothing_is_decoded_further_or_unknown():
    logits = designed({"No": 0.05, "Yes": 0.05, "A": 0.9})[None].repeat(3, 1)  # "A" wins a YN question
    questions = [Question(f"q{i}", "Is someone riding?") for i in range(3)]
    model = DesignedLogits(logits, ["A yes it is", "A", "Yes"])
    results = model.score_yes_no(questions)
    assert [r.prediction for r in results] == ["unknown", "unknown", "yes"]
    assert [r.parse_rule for r in results] == ["greedy:unparsed", "greedy:unparsed", "greedy:first-word"]
    assert model.asked == ["q0", "q1", "q2"]
    assert all(r.confidence == pytest.approx(0.9, rel=1e-4) for r in results)
    model.continue_tokens = 0  # no decoding past the first token: such answers are unknown
    assert [r.parse_rule for r in model.score_yes_no(questions)] == ["greedy:first-token"] * 3
    cannot = DesignedLogits(logits, None)
    assert {r.prediction for r in cannot.score_yes_no(questions)} == {"unknown"}


def test_multiple_choice_decides_by_the_decoded_letter():
    logits = torch.stack([designed({"B": 0.5, "A": 0.3, "C": 0.2}), designed({" the": 0.6, "C": 0.4}),
                          designed({" the": 0.6, "C": 0.4})])
    options = ("ride", "hold", "eat", "cut")
    questions = [Question(f"m{i}", "Which?", options=options) for i in range(3)]
    results = DesignedLogits(logits, ["The answer: D", "D) cut"]).score_multiple_choice(questions)
    assert [r.prediction for r in results] == ["B", "unknown", "D"]
    assert results[0].option_probs == pytest.approx((0.3, 0.5, 0.2, 0.0), abs=1e-6)
    assert results[2].option_probs[2] == pytest.approx(1.0, abs=1e-6)  # the score: "C" had all the letter mass


# ---- real tiny models: the recorded answer is what HF generate decodes ------------------------------
@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    base = tmp_path_factory.mktemp("decoding")
    rng = np.random.default_rng(0)
    paths = []
    for k in range(3):
        path = base / f"{k}.png"
        Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "instructblip"])
def test_decoded_answers_agree_with_generate_on_every_row(tiny_dirs, scene, family):
    model = create_model("tiny", {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
    verbs, objects = ["riding", "holding", "eating", "washing"], ["horse", "cake", "bicycle"]
    yn = [Question(f"y{i}", f"Is the person {verbs[i % 4]} the {objects[i % 3]}?", scene[i % 3]) for i in range(9)]
    options = ("riding", "holding", "eating", "washing")
    mc = [Question(f"m{i}", "Which of the following actions is present in the image?\nA. riding\nB. holding\n"
                   "C. eating\nD. washing", scene[i % 3], options) for i in range(3)]
    for questions, multiple_choice in ((yn, False), (mc, True)):
        score = model.score_multiple_choice if multiple_choice else model.score_yes_no
        results = score(questions)
        generated = model.continue_answers(questions, multiple_choice)  # greedy (== generate: test_decoding_variants)
        for question, result, text in zip(questions, results, generated):
            first = result.raw_answer if result.parse_rule.endswith("first-token") else None
            # the scoring argmax is the first token generate decodes, and the decision is the parse of that text
            assert first is None or text.startswith(first.strip()) or text.startswith(first), (text, first)
            if first is None:
                assert result.raw_answer == text
            decide = (lambda f, t: decide_choice(f, t, question.options)) if multiple_choice else decide_yes_no
            expected = decide(first if first is not None else "", text if first is None else None)[0]
            assert result.prediction == expected, (question.question_id, text, result)
            assert 0 < result.confidence <= 1


class DesignedDecoding(DesignedLogits):
    """A designed backend whose variant's decoding gives each question the answer of ``decoded``."""

    variant_features = frozenset({"decoding:greedy", "decoding:beam", "decoding:sample", "decoding:opera"})

    def __init__(self, logits: torch.Tensor, decoded: list[DecodedAnswer]):
        super().__init__(logits, None)
        self.decoded = decoded

    def decode_answers(self, questions, multiple_choice, openings=None):
        return self.decoded[: len(questions)]


@pytest.mark.parametrize("variant", [{"decoding": "sample"}, {"decoding": "beam", "num_beams": 2},
                                     {"decoding": "opera", "num_beams": 2}])
def test_a_decoding_that_ends_at_once_is_unknown_whatever_the_first_argmax(variant):
    """The first position's argmax is "Yes" (P = .9), but the variant's decoding ended at once (end of sequence
    first): the model said nothing, so the answer is unknown (rule `empty`), not the argmax's "yes"."""
    model = DesignedDecoding(designed({"Yes": 0.9, "No": 0.1})[None].repeat(2, 1), [DecodedAnswer(None, "", 0.2)] * 2)
    model.use_variant(Variant.from_config({**variant, "max_new_tokens": 2}))
    results = model.score_yes_no([Question("q0", "Is someone riding?"), Question("q1", "Is someone eating?")])
    label = model.variant.label
    assert [(r.prediction, r.raw_answer, r.parse_rule) for r in results] == [("unknown", "", f"{label}:empty")] * 2
    assert all(r.p_yes == pytest.approx(0.9, rel=1e-4) for r in results)  # the first-token score stays
    assert [r.confidence for r in results] == [0.2, 0.2]  # the end token's, as its decoding drew it


@pytest.mark.parametrize("variant", [{"decoding": "sample", "temperature": 0.5}, {"decoding": "opera", "num_beams": 2}])
@pytest.mark.parametrize("multiple_choice", [False, True])
def test_the_confidence_of_a_decoded_answer_is_its_first_tokens_probability_where_it_was_drawn(variant,
                                                                                                  multiple_choice):
    """Sampling at T = 0.5 (or OPERA's penalised candidates) drew "No" with probability .3, while the first
    position's softmax gives it .1: the confidence is the .3 the decoding drew it with (docs/models.md), the
    scores (P(yes), option probabilities) stay the first position's."""
    tokenizer = build_tokenizer()
    word = "B" if multiple_choice else "No"
    (token,) = tokenizer.encode(word, add_special_tokens=False)
    model = DesignedDecoding(designed({"Yes": 0.5, "A": 0.4, word: 0.1})[None], [DecodedAnswer(token, word, 0.3)])
    model.use_variant(Variant.from_config({**variant, "max_new_tokens": 2}))
    if multiple_choice:
        (result,) = model.score_multiple_choice([Question("m0", "Which?", None, ("ride", "hold"))])
        assert result.prediction == "B" and result.option_probs[1] == pytest.approx(0.2, rel=1e-4)
    else:
        (result,) = model.score_yes_no([Question("q0", "Is someone riding?")])
        assert result.prediction == "no" and result.p_yes == pytest.approx(5 / 6, rel=1e-4)
    assert result.confidence == 0.3
