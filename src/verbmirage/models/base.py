"""The one interface every model backend implements.

A backend answers batches of :class:`Question` in three ways:

- :meth:`VisionLanguageModel.score_yes_no` -> one :class:`YesNoResult` per
  question: ``p_yes`` (probability mass of "yes" over "yes"+"no" at the first
  answer position), the parsed ``prediction`` ("yes", "no" or "unknown"), the
  raw answer text, ``confidence`` (the probability of the answer's first token in
  the distribution its decoding drew it from, paper Eq. 2), the rule that parsed the
  text, and, where the backend has the yes/no logits at hand, ``yes_margin`` = logsumexp(z[yes]) - logsumexp(z[no])
  in float64 (P(yes) = sigmoid(yes_margin); it stays finite and keeps the
  ranking where P(yes) saturates at 1.0, which average precision needs).
- :meth:`VisionLanguageModel.score_multiple_choice` -> one
  :class:`MultipleChoiceResult`: a probability per option (in the order of
  ``Question.options``), the chosen letter, raw text, confidence.
- :meth:`VisionLanguageModel.generate` -> free text per question.

The public methods validate the batch once and call the backend's private
``_score_yes_no`` / ``_score_multiple_choice`` / ``_generate``. A backend
that fails on one question returns a result with ``error`` set rather than
raising, so a batch never loses its other answers. A result whose numbers
break the rules of :class:`YesNoResult` / :class:`MultipleChoiceResult` (a NaN
or infinite score where the answer has one: NaN logits, an overflow, a VCD
``alpha`` of infinity) becomes such an error result in the public methods, so
it counts against a job's error budget instead of passing as an "unknown"
answer (:func:`score_problem`). A failure that asking
again may fix (a timeout, a rate limit) sets ``retry``: such rows are never
stored, so a resumed job asks those questions again. A failure that no
question can survive (a rejected API key) raises :class:`FatalBackendError`,
which stops the job at once.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase

from verbmirage.models.memory import MemoryCosts
from verbmirage.models.prompts import PromptTemplate
from verbmirage.variants.settings import PLAIN_ONLY, Variant

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


#: ``parse_rule`` prefix of an answer read from its text alone (no token probabilities: an API without
#: logprobs, a remote adapter with ``scoring: text``); its scores are the parsed answer's 0/1.
TEXT_SCORED = "text:"


@dataclass(frozen=True)
class _Answer:
    """What every answer holds after its scores (the first field, from the result type's other base)."""

    prediction: str
    raw_answer: str
    confidence: float
    parse_rule: str
    error: str | None = None
    #: A transient failure: not stored, so a resumed job asks again.
    retry: bool = False

    @classmethod
    def _failed(cls, scores, error: str, retry: bool):
        """A question that could not be asked: ``scores`` (NaN) and the error that says why."""
        return cls(scores, UNKNOWN, "", math.nan, "error", error, retry)


@dataclass(frozen=True)
class _YesNoScore:
    p_yes: float


@dataclass(frozen=True)
class _OptionScores:
    option_probs: tuple[float, ...]


# A dataclass takes its bases' fields from the last base listed to the first: the score comes first, then
# _Answer's fields, then the result's own (the order of the constructor's arguments and of the stored columns).
@dataclass(frozen=True)
class YesNoResult(_Answer, _YesNoScore):
    """One yes/no answer. Which numbers may be undefined (the rest are finite; :func:`score_problem`):

    - ``p_yes``: NaN where P(yes) is undefined: a text-scored answer (``parse_rule`` ``text:...``) that is
      neither yes nor no, or a distribution with no mass on any yes or no spelling (VCD's plausibility cut
      removed them all). Never infinite.
    - ``confidence``: NaN only for a text-scored answer (no token probabilities).
    - ``yes_margin``, ``yes_mass``, ``vcd_kl``, ``vcd_kl_reverse``, ``vcd_plausible``: None where undefined or not
      computed; never NaN or infinite.

    A result with ``error`` set is a question without an answer: its numbers are NaN and not checked.
    """

    #: logsumexp(z[yes]) - logsumexp(z[no]) at the first answer position (float64); None without logits.
    yes_margin: float | None = None
    #: VCD only: KL of the contrasted first-token distribution against the truncated plain one, and the
    #: size of the plausibility set (``io.PREDICTIONS``).
    vcd_kl: float | None = None
    vcd_plausible: int | None = None
    #: VCD only: the other direction, KL of the truncated plain distribution against the contrasted one.
    vcd_kl_reverse: float | None = None
    #: The yes tokens' probability mass over the whole vocabulary at the first answer position (P(yes) not
    #: renormalised by yes + no); None without logits.
    yes_mass: float | None = None

    @classmethod
    def failed(cls, error: str, retry: bool = False) -> "YesNoResult":
        """The result of a question that could not be asked (the error says why)."""
        return cls._failed(math.nan, error, retry)


@dataclass(frozen=True)
class MultipleChoiceResult(_Answer, _OptionScores):
    """One multiple-choice answer; the rules of :class:`YesNoResult`, and:

    - ``option_probs``: one finite probability per option, or all NaN where undefined (no mass on any
      option letter, or a decision rule that could not calibrate them). A text-scored answer has the parsed
      letter's 0/1. Never a mix of finite and NaN, never infinite.
    """

    vcd_kl: float | None = None
    vcd_plausible: int | None = None
    vcd_kl_reverse: float | None = None

    @classmethod
    def failed(cls, n_options: int, error: str, retry: bool = False) -> "MultipleChoiceResult":
        return cls._failed((math.nan,) * n_options, error, retry)


def score_problem(result) -> str | None:
    """The first number of ``result`` that breaks its type's rules (see :class:`YesNoResult`), as
    ``name = value``; None when all hold, for a result with ``error`` set, and for anything but a result.

    A backend returns such a number only when its computation failed (NaN or infinite logits: an fp16
    overflow, a VCD ``alpha`` of infinity); an undefined score is NaN or None where the rules allow it.
    """
    if not isinstance(result, (YesNoResult, MultipleChoiceResult)) or result.error is not None:
        return None
    scores = {"confidence": result.confidence}
    if isinstance(result, YesNoResult):
        scores["p_yes"] = result.p_yes
    probs = {f"option_probs[{i}]": p for i, p in enumerate(getattr(result, "option_probs", ()))}
    optional = {name: getattr(result, name, None) for name in ("yes_margin", "yes_mass", "vcd_kl", "vcd_kl_reverse")}
    optional = {name: value for name, value in optional.items() if value is not None}  # None: undefined
    for name, value in {**scores, **probs, **optional}.items():
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return f"{name} = {value!r}, not a number"
        if math.isinf(value):
            return f"{name} = {value}"
    if math.isnan(result.confidence) and not result.parse_rule.startswith(TEXT_SCORED):
        return "confidence = nan"
    for name, value in optional.items():
        if math.isnan(value):
            return f"{name} = nan"
    undefined = sum(math.isnan(p) for p in probs.values())
    if 0 < undefined < len(probs):
        return f"option_probs = {tuple(result.option_probs)} (some NaN, some not)"
    return None


@dataclass(frozen=True)
class ModelContext:
    """Resources of the run a backend may need (e.g. training-split statistics)."""

    dataset: str = "hico"
    train_stats: Path | None = None
    #: question id -> the correct answer, given only to a backend that declares ``reads_answers`` (the noisy
    #: oracle, :mod:`verbmirage.models.oracle`); None for every other backend
    answers: dict[str, str] | None = None


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


#: the key of :meth:`VisionLanguageModel.device_path` naming the compiled parts that failed during a run (a
#: run's, not the device's: paths that differ only there compute alike where nothing fails)
COMPILE_FAILED = "compile_failed"


class VisionLanguageModel(ABC):
    """Base class of every backend. Subclasses set ``backend`` and implement the private methods.

    What a backend can do is declared here, each with the default most backends have; a backend that differs
    sets its own (``uses_images``, ``reads_answers``, ``mixed_kinds``, ``continue_tokens``, ``prompts``,
    ``checks_scores``, ``variant_features``).
    """

    backend: str = ""
    #: Whether the backend reads images; blind baselines set False.
    uses_images: bool = True
    #: Whether the backend is given every question's correct answer (``ModelContext.answers``): the oracle only.
    reads_answers: bool = False
    #: Whether the backend has a ``score_mixed(questions, multiple_choice)`` that scores yes/no and multiple-choice
    #: questions in one pass (:func:`score_questions`; the transformers engine: each image's prefix once).
    mixed_kinds: bool = False
    #: New tokens decoded greedily past a first answer token that decides nothing (``inference.continue_tokens``,
    #: set by the job); None for a backend that does not decode its answers token by token.
    continue_tokens: int | None = None
    #: The prompts the backend words its questions with (:meth:`use_variant` adds the variant's suffix); None for a
    #: backend that renders no prompt of ours (baselines, CLIP).
    prompts: PromptTemplate | None = None

    def __init__(self, name: str):
        self.name = name

    def score_yes_no(self, questions: Sequence[Question]) -> list[YesNoResult]:
        self._check(questions, multiple_choice=False)
        results = list(self._score_yes_no(list(questions)))
        self._check_results(questions, results)
        return results

    def score_multiple_choice(self, questions: Sequence[Question]) -> list[MultipleChoiceResult]:
        self._check(questions, multiple_choice=True)
        results = list(self._score_multiple_choice(list(questions)))
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

    #: Whether :meth:`_check_results` checks the numbers of each result (:func:`score_problem`). False only for
    #: a wrapper whose results are another model's, already checked there, passed through a decision rule
    #: (``decisions.CalibratedModel``: a text-scored answer keeps its NaN confidence under a new ``parse_rule``).
    checks_scores: bool = True
    #: Variant features this backend offers (its capabilities; its registry row's ``features`` repeats them for
    #: planning without importing a backend, and a test keeps the two equal).
    variant_features: frozenset[str] = PLAIN_ONLY
    #: The variant this model answers with (:meth:`use_variant`); plain greedy until told otherwise.
    variant: Variant = Variant()

    def use_variant(self, variant: Variant, where: str = "variant") -> None:
        """Answer with ``variant`` from now on; refuse one this backend cannot run (naming what it lacks).

        The prompt suffix is applied here for every backend that renders through a ``PromptTemplate``;
        decoding methods are the backends' own (:class:`~verbmirage.models.hf.engine.TransformersVLM`).
        """
        offered = self.variant_features
        missing = sorted(variant.features() - offered)
        if missing:
            raise ValueError(f"{where}: backend '{self.backend}' ({self.name}) cannot run {sorted(variant.features())}"
                             f"; it lacks {missing}")
        self.variant = variant
        if self.prompts is not None:
            self.prompts = dataclasses.replace(self.prompts, suffix=variant.prompt_suffix)

    def use_batch_size(self, batch_size: int) -> int:
        """Forwards hold at most ``batch_size`` questions from now on (the config's ``batch_size``, sized for the
        GPU's memory); returns how many questions to hand the model per call. Most backends: one batch."""
        return batch_size

    def memory_costs(self) -> MemoryCosts | None:
        """Memory per question and per image (docs/models.md, "Batch sizes"); None: the configured batch size."""
        return None

    def device_path(self) -> dict | None:
        """What computes the answers on a GPU that another GPU may compute otherwise (its name, the kernels
        chosen by its generation; under :data:`COMPILE_FAILED` the compiled parts that failed in this process),
        kept with a job's batch sizes so that a resume elsewhere says so; None where nothing depends on the
        device (the CPU, most backends)."""
        return None

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

    def _check_results(self, questions: Sequence[Question], results: list) -> None:
        """One result per question; a result whose numbers break its type's rules (:func:`score_problem`) is
        replaced, in place, by an error result that names the model, the question and the image.

        Every backend's answers pass here (the public methods, and the engine's ``score_mixed``: a backend's
        own ``score_mixed`` must call it too), so a NaN or infinite score becomes an error row that the job's
        error budget counts (``inference.max_error_share``).
        """
        if len(results) != len(questions):
            raise RuntimeError(
                f"backend '{self.backend}' returned {len(results)} results for {len(questions)} questions"
            )
        if not self.checks_scores:
            return
        for index, (question, result) in enumerate(zip(questions, results)):
            problem = score_problem(result)
            if problem is None:
                continue
            error = (f"models.{self.name}: question {question.question_id} on image {question.image}: "
                     f"non-finite score, {problem}; check the model's dtype and the variant's settings")
            results[index] = (YesNoResult.failed(error) if isinstance(result, YesNoResult)
                              else MultipleChoiceResult.failed(len(result.option_probs), error))


def score_questions(model: VisionLanguageModel, questions: list[Question], multiple_choice: list[bool]) -> list:
    """One result per question, YN and MC mixed: one pass where the backend can (:meth:`score_mixed`: each
    image's prefix once), else one call per kind (baselines, CLIP, APIs, remote adapters)."""
    if model.mixed_kinds and len(set(multiple_choice)) > 1:
        return model.score_mixed(questions, list(multiple_choice))
    results: list = [None] * len(questions)
    for flag in (False, True):
        indices = [i for i, mc in enumerate(multiple_choice) if bool(mc) == flag]
        if indices:
            score = model.score_multiple_choice if flag else model.score_yes_no
            for i, result in zip(indices, score([questions[i] for i in indices])):
                results[i] = result
    return results
