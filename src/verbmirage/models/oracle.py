"""A noisy oracle: a stand-in model whose answers carry signal, for the demo and the tests (ours, not the paper's).

The demo's transformers models have random weights: their answers are noise, so the figures built on them
(uncertainty, FOV, MC accuracy) show nothing. The oracle reads the answer key of the questions it is asked
(:attr:`ModelContext.answers`; no other backend is given it) and answers like a model with a stated
``accuracy``: each question is answered correctly with that probability, decided by a draw seeded by
(``seed``, question id), so an answer does not depend on batching, sharding or the other questions. A
question that names a verb but no object (``yn_verb``, ``mc_verb``) is answered right with
``verb_accuracy`` instead, when set: the demo sets it below ``accuracy``, so its Fig. 1 and Table 1 show the
shape of the paper's finding (objects named, few hallucinations; verbs alone, many).

Its scores are shaped like a trained model's: a correct answer is confident (a yes/no margin, or the chosen
option's logit, drawn around ``confidence_gap`` above a wrong answer's), so correct and hallucinated answers
differ in confidence, as the paper's Figs. 9 and 12 find for real models. It never looks at the image, so an
image condition changes nothing. Its rows are a stand-in: the tables say so (``stand_in``).
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from verbmirage.models.base import (
    NO,
    YES,
    ModelContext,
    MultipleChoiceResult,
    VisionLanguageModel,
    YesNoResult,
    option_letter,
)


class NoisyOracle(VisionLanguageModel):
    """A stand-in with signal (ours): reads the answer key and is right with a stated accuracy, surer when right."""

    backend = "oracle"
    uses_images = False
    #: the one backend given the questions' answer key (:class:`ModelContext`)
    reads_answers = True

    def __init__(self, name: str, accuracy: float = 0.8, seed: int = 0, confidence_gap: float = 2.0,
                 verb_accuracy: float | None = None, context: ModelContext | None = None):
        super().__init__(name)
        for key, value in (("accuracy", accuracy), ("verb_accuracy", verb_accuracy)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"models.{name}.{key}: {value} is not in [0, 1]")
        self.accuracy, self.seed, self.gap = float(accuracy), int(seed), float(confidence_gap)
        self.verb_accuracy = self.accuracy if verb_accuracy is None else float(verb_accuracy)
        self.answers = dict((context or ModelContext()).answers or {})

    def _accuracy(self, question) -> float:
        """``verb_accuracy`` for a question about a verb alone, ``accuracy`` for any other."""
        return self.verb_accuracy if question.verb is not None and question.object is None else self.accuracy

    def _draws(self, question_id: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(question_id.encode())])

    def _truth(self, question) -> str:
        try:
            return self.answers[question.question_id]
        except KeyError:
            raise ValueError(f"oracle {self.name}: no answer key for question {question.question_id}") from None

    def _score_yes_no(self, questions):
        results = []
        for question in questions:
            rng = self._draws(question.question_id)
            correct = rng.random() < self._accuracy(question)
            says_yes = (self._truth(question) == YES) == correct
            strength = abs(rng.normal(self.gap if correct else self.gap / 4, 1.0))
            margin = strength if says_yes else -strength
            p_yes = 1.0 / (1.0 + math.exp(-margin))
            prediction = YES if says_yes else NO
            results.append(YesNoResult(p_yes, prediction, prediction, max(p_yes, 1.0 - p_yes), "oracle",
                                       yes_margin=margin))
        return results

    def _score_multiple_choice(self, questions):
        results = []
        for question in questions:
            rng = self._draws(question.question_id)
            n = len(question.options)
            truth = ord(self._truth(question)) - ord("A")
            correct = rng.random() < self._accuracy(question) or n == 1
            wrong = [i for i in range(n) if i != truth]
            chosen = truth if correct else int(rng.choice(wrong))
            logits = rng.normal(0.0, 0.5, n)
            logits[chosen] = logits.max() + abs(rng.normal(self.gap if correct else self.gap / 4, 1.0))
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            letter = option_letter(chosen)
            results.append(MultipleChoiceResult(tuple(float(p) for p in probs), letter, letter, float(probs[chosen]),
                                                "oracle"))
        return results
