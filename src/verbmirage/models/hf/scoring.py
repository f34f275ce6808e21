"""Scores from the logits at the first answer position: :class:`LogitsVLM`, the base of the transformers engine.

From the first-position logits it computes the per-question numbers (the yes and no mass, ``yes_margin``,
``yes_mass``, the option letters' mass, the first token's probability) and decides each answer from its
first token, or from the variant's decoding where that token does not decide it (the strategy's
:attr:`~verbmirage.variants.strategies.Decoding.decides_by_first_token`); the rows themselves come from
:mod:`verbmirage.models.answers`, the rule the remote-code adapters share.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from verbmirage.models import answers
from verbmirage.models.base import UNKNOWN, MultipleChoiceResult, Question, VisionLanguageModel, YesNoResult
from verbmirage.models.hf.handoff import Openings
from verbmirage.models.hf.tokens import answer_token_ids, decode_or_none
from verbmirage.models.parsing import decide_choice, yes_no_token


def _probabilities(probs: torch.Tensor, tokens: list[int]) -> list[float]:
    """P(token) of each row over the real tokens; 0 for an id of the output layer's padding (never a real
    answer). One gather for all rows: a thousand-row call spent more on per-row indexing than on its forwards."""
    real = torch.tensor([token if token < probs.shape[1] else 0 for token in tokens], dtype=torch.long)
    chosen = probs[torch.arange(len(tokens)), real].tolist()
    return [value if token < probs.shape[1] else 0.0 for value, token in zip(chosen, tokens)]


class DecodedAnswer(NamedTuple):
    """One question's answer as a decoding strategy decoded it."""

    first: int | None  # its first token (None: it ended at once)
    text: str
    #: the probability of its first token (the end token, for an answer that ended at once) in the distribution
    #: the first step drew it from (:class:`~verbmirage.variants.search.Decoded`): the answer's ``confidence``
    probability: float


class LogitsVLM(VisionLanguageModel):
    """Scores from the logits at the first answer position; subclasses provide :meth:`answer_logits`.

    Needs ``self.tokenizer`` and a call of :meth:`_find_answer_tokens` once it exists.
    """

    #: New tokens decoded greedily when the first answer token decides nothing (``inference.continue_tokens``).
    continue_tokens: int = 8

    def answer_logits(self, questions: list[Question], multiple_choice: bool) -> tuple:
        """Float32 logits [N, vocab] at each question's first answer position, per-question errors and,
        optionally, per-question extra result fields (a list of dicts, one per question: VCD's statistics),
        each in the order of ``questions``, and optionally their decoding's hand-off (:class:`~.handoff.Openings`)."""
        raise NotImplementedError

    @property
    def strategy(self):
        """The decoding strategy of the current variant (:mod:`verbmirage.variants.registry`), built once per
        variant."""
        kept = getattr(self, "_strategy", None)
        if kept is None or kept.variant is not self.variant:
            kept = self._strategy = self.variant.strategy()
        return kept

    def _find_answer_tokens(self) -> None:
        self._yes_ids, self._no_ids, self._letter_ids = self._answer_token_ids()
        ids = lambda groups: frozenset(int(i) for group in groups for i in group.tolist())  # noqa: E731
        self.deciding_tokens = {True: ids(self._letter_ids), False: ids((self._yes_ids, self._no_ids))}

    def _answer_token_ids(self):
        """Ids of every vocabulary token that spells yes / no / an option letter (see :func:`answer_token_ids`)."""
        yes, no, letters = answer_token_ids(self._vocabulary(), f"models.{self.name}")

        def to_tensor(ids):
            return torch.tensor(ids, dtype=torch.long)

        return to_tensor(yes), to_tensor(no), [to_tensor(ids) for ids in letters]

    def _vocabulary(self) -> list[str | None]:
        """Decoded text of each token id; None where the tokenizer cannot decode an id alone."""
        return [decode_or_none(self.tokenizer, i) for i in range(len(self.tokenizer))]

    def real_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits of real tokens only: output layers padded past the tokenizer (Qwen: 151936 rows for
        151860 tokens) would otherwise take probability mass and could win the argmax (S5)."""
        return logits[:, : len(self.tokenizer)]

    def _token_text(self, token_id: int) -> str:
        return decode_or_none(self.tokenizer, token_id) or ""

    # ---- decoding past the first token ---------------------------------------------
    def continue_answers(self, questions: list[Question], multiple_choice: bool,
                         openings: Openings | None = None) -> list[str] | None:
        """The greedy answer text of each question, first token included (``continue_tokens`` new tokens).

        Asked only for answers whose first token decides nothing (neither yes/no nor an
        option letter). None: this backend cannot decode further, so those answers are unknown.
        """
        return None

    def continuations(self, questions: list[Question], rows: list[int], multiple_choice: bool,
                      openings: Openings | None = None) -> dict[int, str]:
        """The greedy continuation (:meth:`continue_answers`) of the questions at ``rows`` of ``questions``, by
        row: how an answer whose first token decides nothing is decided (also for the attention analysis, which
        decides its predictions as the scoring run does). Empty where no row needs one, ``continue_tokens`` is 0
        or the backend cannot decode further."""
        if not rows or self.continue_tokens <= 0:
            return {}
        texts = self.continue_answers([questions[i] for i in rows], multiple_choice, openings=openings)
        return {} if texts is None else dict(zip(rows, texts))

    def decode_answers(self, questions: list[Question], multiple_choice: bool,
                       openings: Openings | None = None) -> list[DecodedAnswer]:
        """The variant's decoded answer of each question. Backends that run beam search, sampling or VCD implement
        it (:class:`TransformersVLM`), continuing from the scoring call's hand-off ``openings`` where given."""
        raise NotImplementedError(f"backend '{self.backend}' decodes greedily only")

    def stop_tokens(self) -> set[int]:
        """Token ids that end an answer (the tokenizer's end of sequence; the transformers backends add the
        generation config's)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return {eos} if eos is not None else set()

    def _decisions(self, questions: list[Question], errors: list, best: torch.Tensor, multiple_choice: bool,
                   decided, openings: Openings | None = None) \
            -> tuple[list[int | None], dict[int, str], dict[int, float]]:
        """The first answer token of each question (None: the answer ended at once), where needed its decoded
        text, and the first token's probability of each answer a decoding strategy decoded
        (:attr:`DecodedAnswer.probability`).

        Plain greedy: the first-position argmax, and a greedy continuation only where that token decides
        nothing (``decided``). Greedy with VCD: the same, continued by VCD's greedy steps. Beam search, sampling
        and OPERA: every answer decoded in full (its first token need not be the argmax). An answer whose
        first token ends it (end of sequence) is empty, whatever the decoding: it decides nothing.
        """
        stop = self.stop_tokens()
        first_ids: list[int | None] = [None if token in stop else token for token in best.tolist()]  # one copy
        strategy = self.strategy
        if strategy.decides_by_first_token:
            undecided = [i for i, error in enumerate(errors) if error is None and first_ids[i] is not None
                         and not decided(i, self._token_text(first_ids[i]))]
            if strategy.streams == 1:  # plain greedy: the scoring argmax stays the first token
                return first_ids, self.continuations(questions, undecided, multiple_choice, openings), {}
            rows = undecided if self.continue_tokens > 0 else []
        else:
            rows = [i for i, error in enumerate(errors) if error is None]
        if not rows:
            return first_ids, {}, {}
        decoded = dict(zip(rows, self.decode_answers([questions[i] for i in rows], multiple_choice, openings)))
        for i, answer in decoded.items():
            first_ids[i] = answer.first  # None: the decoding ended at once (its rows stop before the end token)
        return first_ids, {i: a.text for i, a in decoded.items()}, {i: a.probability for i, a in decoded.items()}

    def _answer_texts(self, first_ids: list[int | None], continued: dict[int, str]) -> list[tuple[str, str | None]]:
        """Per question, (its first token's text, its decoded text or None) for the parsers; an answer that
        ended at once is ("", ""), which parses as ``unknown`` by the rule ``empty``."""
        return [("", "") if token is None else (self._token_text(token), continued.get(i))
                for i, token in enumerate(first_ids)]

    def _confidences(self, probs: torch.Tensor, first_ids: list[int | None], decoded: dict[int, float]) -> list[float]:
        """The probability of each answer's first token (paper Eq. 2) in the distribution it was drawn from: as
        its decoding reports it where a strategy decoded the answer (``decoded``: sampling's warped
        distribution, OPERA's penalised candidates, VCD's contrast after the cut); otherwise (greedy: the first
        token is the argmax of ``probs``, the variant's first-position distribution) from ``probs``, and for an
        answer that ended at once that of the most probable end token (the token it ended with)."""
        stop = sorted(token for token in self.stop_tokens() if token < probs.shape[1])
        ending = probs[:, stop].max(dim=-1).values.tolist() if stop else [math.nan] * len(first_ids)
        chosen = _probabilities(probs, [0 if token is None else token for token in first_ids])
        return [decoded[i] if i in decoded else ending[i] if token is None else chosen[i]
                for i, token in enumerate(first_ids)]

    @staticmethod
    def _columns(questions: list[Question], columns: list[dict] | None) -> list[dict]:
        return [{}] * len(questions) if columns is None else columns

    # ---- results ----------------------------------------------------------------
    #: Whether :meth:`answer_logits` takes one kind per question (then :meth:`score_mixed` scores YN and MC
    #: questions in one pass, each image's prefix computed once for both).
    mixed_kinds: bool = False

    def score_mixed(self, questions: list[Question], multiple_choice: list[bool]) -> list:
        """YN and MC questions in one call: one logits pass, each answer decided by its own kind's rule.

        The results equal those of :meth:`score_yes_no` / :meth:`score_multiple_choice` on each kind
        alone; the gain is that an image's prefix is computed once for all its questions.
        """
        if not self.mixed_kinds:
            raise NotImplementedError(f"backend '{self.backend}' scores one question kind per call")
        kinds = {False: [], True: []}
        for index, flag in enumerate(multiple_choice):
            kinds[bool(flag)].append(index)
        for flag, indices in kinds.items():
            self._check([questions[i] for i in indices], multiple_choice=flag)
        logits, errors, columns, openings = self._logits(questions, [bool(flag) for flag in multiple_choice])
        results: list = [None] * len(questions)
        for flag, indices in kinds.items():
            if not indices:
                continue
            decide = self._multiple_choice_results if flag else self._yes_no_results
            chosen = decide([questions[i] for i in indices], logits[indices], [errors[i] for i in indices],
                            [columns[i] for i in indices], openings)
            for i, result in zip(indices, chosen):
                results[i] = result
        self._check_results(questions, results)
        return results

    def _logits(self, questions: list[Question], multiple_choice) -> tuple[torch.Tensor, list, list[dict], Openings]:
        """:meth:`answer_logits`, with its per-question columns (``[{}] * n`` where it returns none) and hand-off."""
        answer = self.answer_logits(questions, multiple_choice)
        logits, errors = answer[0], answer[1]
        return (logits, errors, answer[2] if len(answer) > 2 else [{}] * len(questions),
                answer[3] if len(answer) > 3 else Openings())

    def _score_yes_no(self, questions: list[Question]) -> list[YesNoResult]:
        """Score (P(yes), ``yes_margin``) from the first answer position; decision from the decoded answer."""
        return self._yes_no_results(questions, *self._logits(questions, multiple_choice=False))

    def _yes_no_results(self, questions: list[Question], logits: torch.Tensor, errors: list,
                        columns: list[dict], openings: Openings | None = None) -> list[YesNoResult]:
        """``columns``: each question's extra result fields from its logits pass (VCD's statistics)."""
        probs = torch.softmax(self.real_tokens(logits), dim=-1)
        yes, no = probs[:, self._yes_ids].sum(-1), probs[:, self._no_ids].sum(-1)
        # float64, from the logits themselves: finite where the float32 P(yes) above is exactly 1.0
        real = self.real_tokens(logits).double()
        yes_log_mass = torch.logsumexp(real[:, self._yes_ids], -1)
        margins = yes_log_mass - torch.logsumexp(real[:, self._no_ids], -1)
        # the yes mass over the vocabulary, float64 too: in float32 a confident model's rows all tie at 1.0
        masses = (yes_log_mass - torch.logsumexp(real, -1)).exp().tolist()
        first_ids, continued, decoded = self._decisions(questions, errors, probs.argmax(dim=-1), False,
                                                        lambda i, text: yes_no_token(text) is not None, openings)
        texts = self._answer_texts(first_ids, continued)
        return answers.yes_no_results(yes.numpy(), no.numpy(), margins.tolist(), masses,
                                      self._confidences(probs, first_ids, decoded), texts, errors,
                                      self.variant.label, columns)

    def _score_multiple_choice(self, questions: list[Question]) -> list[MultipleChoiceResult]:
        """Option probabilities from the first answer position; the chosen letter from the decoded answer."""
        return self._multiple_choice_results(questions, *self._logits(questions, multiple_choice=True))

    def _multiple_choice_results(self, questions: list[Question], logits: torch.Tensor, errors: list,
                                 columns: list[dict], openings: Openings | None = None) -> list[MultipleChoiceResult]:
        probs = torch.softmax(self.real_tokens(logits), dim=-1)
        first_ids, continued, decoded = self._decisions(
            questions, errors, probs.argmax(dim=-1), True,
            lambda i, text: decide_choice(text, None, questions[i].options)[0] != UNKNOWN, openings)
        texts = self._answer_texts(first_ids, continued)
        letters = max((len(question.options) for question in questions), default=0)
        masses = torch.stack([probs[:, ids].sum(-1) for ids in self._letter_ids[:letters]], dim=1).tolist() \
            if letters else [[]] * len(questions)
        return answers.choice_results(masses, self._confidences(probs, first_ids, decoded), texts, errors,
                                      [question.options for question in questions], self.variant.label, columns)
