"""The one interface every model backend implements.

A backend answers batches of :class:`Question` in three ways:

- :meth:`VisionLanguageModel.score_yes_no` -> one :class:`YesNoResult` per
  question: ``p_yes`` (probability mass of "yes" over "yes"+"no" at the first
  answer position), the parsed ``prediction`` ("yes", "no" or "unknown"), the
  raw answer text, ``confidence`` (max softmax probability of the answer token,
  paper Eq. 2), the rule that parsed the text, and, where the backend has the
  yes/no logits at hand, ``yes_margin`` = logsumexp(z[yes]) - logsumexp(z[no])
  in float64 (P(yes) = sigmoid(yes_margin); it stays finite and keeps the
  ranking where P(yes) saturates at 1.0, which average precision needs).
- :meth:`VisionLanguageModel.score_multiple_choice` -> one
  :class:`MultipleChoiceResult`: a probability per option (in the order of
  ``Question.options``), the chosen letter, raw text, confidence.
- :meth:`VisionLanguageModel.generate` -> free text per question.

The public methods validate the batch once and call the backend's private
``_score_yes_no`` / ``_score_multiple_choice`` / ``_generate``. A backend
that fails on one question returns a result with ``error`` set rather than
raising, so a batch never loses its other answers. A failure that asking
again may fix (a timeout, a rate limit) sets ``retry``: such rows are never
stored, so a resumed job asks those questions again. A failure that no
question can survive (a rejected API key) raises :class:`FatalBackendError`,
which stops the job at once.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase

from verbmirage.imaging import open_rgb  # noqa: F401  (re-exported for the backends)
from verbmirage.variants import PLAIN_ONLY, Variant

YES, NO, UNKNOWN = "yes", "no", "unknown"


class FatalBackendError(RuntimeError):
    """The backend cannot answer any question (e.g. HTTP 401/403): stop the job, keep what is stored."""


@dataclass(frozen=True)
class Question:
    """What a backend may read of a question.

    ``image`` is the file the model sees (None for blind use); ``prompt`` is
    the question text, with the lettered options for MC; ``verb``/``object``
    are metadata that only blind baselines use.
    """

    question_id: str
    prompt: str
    image: Path | None = None
    options: tuple[str, ...] = ()
    verb: str | None = None
    object: str | None = None


@dataclass(frozen=True)
class YesNoResult:
    p_yes: float
    prediction: str
    raw_answer: str
    confidence: float
    parse_rule: str
    error: str | None = None
    #: A transient failure: not stored, so a resumed job asks again.
    retry: bool = False
    #: logsumexp(z[yes]) - logsumexp(z[no]) at the first answer position (float64); None without logits.
    yes_margin: float | None = None
    #: VCD only: KL of the contrasted first-token distribution against the truncated plain one, and the
    #: size of the plausibility set (``io.PREDICTIONS``).
    vcd_kl: float | None = None
    vcd_plausible: int | None = None
    #: The yes tokens' probability mass over the whole vocabulary at the first answer position (P(yes) not
    #: renormalised by yes + no); None without logits.
    yes_mass: float | None = None

    @classmethod
    def failed(cls, error: str, retry: bool = False) -> "YesNoResult":
        """The result of a question that could not be asked (the error says why)."""
        return cls(math.nan, UNKNOWN, "", math.nan, "error", error, retry)


@dataclass(frozen=True)
class MultipleChoiceResult:
    option_probs: tuple[float, ...]
    prediction: str
    raw_answer: str
    confidence: float
    parse_rule: str
    error: str | None = None
    #: A transient failure: not stored, so a resumed job asks again.
    retry: bool = False
    vcd_kl: float | None = None
    vcd_plausible: int | None = None

    @classmethod
    def failed(cls, n_options: int, error: str, retry: bool = False) -> "MultipleChoiceResult":
        return cls((math.nan,) * n_options, UNKNOWN, "", math.nan, "error", error, retry)


@dataclass(frozen=True)
class ModelContext:
    """Resources of the run a backend may need (e.g. training-split statistics)."""

    dataset: str = "hico"
    train_stats: Path | None = None


#: What configs/paper.yaml says where a checkpoint's commit must be written in; refused until replaced.
PLACEHOLDER_REVISION = "REPLACE-WITH-HF-COMMIT"


def allow_remote_code(where: str, trust_remote_code, revision: str | None, path: str | None) -> bool:
    """Whether a checkpoint's own code may run: only a real ``True``, and only for pinned code.

    A string such as ``"false"`` is truthy in Python, so anything but a bool is
    refused. With ``True`` the code must be pinned: a ``revision`` for a hub id;
    a local folder is pinned by its contents (its files are in the fingerprint).
    """
    if not isinstance(trust_remote_code, bool):
        raise ValueError(
            f"{where}.trust_remote_code: must be a YAML boolean (true or false), "
            f"got {trust_remote_code!r} ({type(trust_remote_code).__name__})"
        )
    if trust_remote_code and revision == PLACEHOLDER_REVISION:
        raise ValueError(
            f"{where}.revision: '{revision}' is a placeholder; write the commit of {path} that you run "
            "(its hub page, 'Files and versions', lists them)"
        )
    if trust_remote_code and not revision and not (path and Path(path).is_dir()):
        raise ValueError(
            f"{where}.revision: trust_remote_code runs the checkpoint's code; pin it with `revision: <commit>` "
            f"(path '{path}' is not a local folder)"
        )
    return trust_remote_code


def logsumexp(values) -> float:
    """log(sum(exp(v))) in float64 without overflow; -inf for no values."""
    values = [float(v) for v in values]
    if not values:
        return -math.inf
    top = max(values)
    if math.isinf(top):
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def yes_no_margin(yes_logits, no_logits) -> float | None:
    """logsumexp(yes) - logsumexp(no) (logits or log-probabilities: the normaliser cancels); None if undefined.

    Undefined when a side has no value (an API's top-k list without any "no" token) or
    both sides are -inf: the margin would only be a bound, not a score.
    """
    yes, no = logsumexp(yes_logits), logsumexp(no_logits)
    if math.isinf(yes) or math.isinf(no) or math.isnan(yes) or math.isnan(no):
        return None
    return yes - no


def option_letter(index: int) -> str:
    return ascii_uppercase[index]


class VisionLanguageModel(ABC):
    """Base class of every backend. Subclasses set ``backend`` and implement the private methods."""

    backend: str = ""
    #: Whether the backend reads images; blind baselines set False.
    uses_images: bool = True

    def __init__(self, name: str):
        self.name = name

    def score_yes_no(self, questions: Sequence[Question]) -> list[YesNoResult]:
        self._check(questions, multiple_choice=False)
        results = self._score_yes_no(list(questions))
        self._check_results(questions, results)
        return results

    def score_multiple_choice(self, questions: Sequence[Question]) -> list[MultipleChoiceResult]:
        self._check(questions, multiple_choice=True)
        results = self._score_multiple_choice(list(questions))
        self._check_results(questions, results)
        return results

    def generate(self, questions: Sequence[Question], max_new_tokens: int = 32) -> list[str]:
        self._check(questions, multiple_choice=None)
        texts = self._generate(list(questions), max_new_tokens)
        self._check_results(questions, texts)
        return texts

    @abstractmethod
    def _score_yes_no(self, questions: list[Question]) -> list[YesNoResult]: ...

    @abstractmethod
    def _score_multiple_choice(self, questions: list[Question]) -> list[MultipleChoiceResult]: ...

    def _generate(self, questions: list[Question], max_new_tokens: int) -> list[str]:
        raise NotImplementedError(f"backend '{self.backend}' does not generate free text")

    #: Variant features a custom backend offers (built-in backends: ``registry.VARIANT_FEATURES``).
    variant_features: frozenset[str] = PLAIN_ONLY
    #: The variant this model answers with (:meth:`use_variant`); plain greedy until told otherwise.
    variant: Variant = Variant()

    def use_variant(self, variant: Variant, where: str = "variant") -> None:
        """Answer with ``variant`` from now on; refuse one this backend cannot run (naming what it lacks).

        The prompt suffix is applied here for every backend that renders through a ``PromptTemplate``;
        decoding methods are the backends' own (:class:`~verbmirage.models.hf.TransformersVLM`).
        """
        from verbmirage.models.registry import VARIANT_FEATURES

        offered = VARIANT_FEATURES.get(self.backend, self.variant_features)
        missing = sorted(variant.features() - offered)
        if missing:
            raise ValueError(f"{where}: backend '{self.backend}' ({self.name}) cannot run {sorted(variant.features())}"
                             f"; it lacks {missing}")
        self.variant = variant
        prompts = getattr(self, "prompts", None)
        if prompts is not None:
            self.prompts = dataclasses.replace(prompts, suffix=variant.prompt_suffix)

    def use_batch_size(self, batch_size: int) -> int:
        """Forwards hold at most ``batch_size`` questions from now on (the config's ``batch_size``, sized for the
        GPU's memory); returns how many questions to hand the model per call. Most backends: one batch."""
        return batch_size

    def fingerprint_extra(self) -> dict:
        """What the answers depend on beyond the config entry, known once loaded (code, environment).

        It joins the resume fingerprint, so parts made by other code or another
        environment are not reused. Most backends are fully described by their entry.
        """
        return {}

    def close(self) -> None:
        """Release what the backend holds (a worker process); called when a job ends."""

    def _check(self, questions: Sequence[Question], multiple_choice: bool | None) -> None:
        for question in questions:
            if multiple_choice is True and len(question.options) < 2:
                raise ValueError(f"question {question.question_id}: multiple choice needs at least two options")
            if multiple_choice is False and question.options:
                raise ValueError(f"question {question.question_id}: a yes/no question has no options")
            if self.uses_images and question.image is None:
                raise ValueError(f"question {question.question_id}: backend '{self.backend}' needs an image")

    def _check_results(self, questions: Sequence[Question], results: Sequence) -> None:
        if len(results) != len(questions):
            raise RuntimeError(
                f"backend '{self.backend}' returned {len(results)} results for {len(questions)} questions"
            )
