"""Decodings as strategy objects: greedy, beam search and sampling (VCD: :mod:`.vcd`; OPERA: :mod:`.opera`).

A strategy is built from a :class:`~verbmirage.variants.settings.Variant` (:func:`.registry.decoding_strategy`)
and does two things:

- it **declares what it needs from the engine**: how many streams a row runs (:attr:`Decoding.streams`: 2
  for VCD's clean and noised image), how many rows a question holds (:attr:`Decoding.beams`), the language
  model's last-layer attention (:attr:`Decoding.needs_last_attention`, OPERA), whether an engine call may
  span several batches (:attr:`Decoding.call_spans_batches`), whether the rows of several prompt widths may
  decode joined (:attr:`Decoding.joins_rows`), and whether the first-position argmax decides an answer
  (:attr:`Decoding.decides_by_first_token`, greedy);
- it **decodes** the rows the engine hands it (:class:`DecodingRows`) with the loops of :mod:`.search`,
  on the steppers those rows open.

The engine (``verbmirage.models.hf``) reads these capabilities instead of the variant's fields; this layer
imports nothing of ``verbmirage.models``: the engine's side is the :class:`DecodingRows` protocol below.
Adding a decoding is one class here (or in a module of its own) and one line in :mod:`.registry`.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from verbmirage.variants import search
from verbmirage.variants.search import AttentionStepper, Stepper
from verbmirage.variants.settings import Variant, question_seed

#: One stream of a batch's rows: ``noised`` -> (first-position logits [rows, vocab], its stepper).
Stream = Callable[[bool], tuple[torch.Tensor, Stepper]]


class DecodingRows(Protocol):
    """The questions of one decoding batch, as the engine hands them to a strategy."""

    #: The model's name (for log lines).
    name: str
    #: Each row's question id (sampling seeds its draws with it).
    question_ids: list[str]

    def open(self, repeats: int, fresh: bool = False) -> tuple[torch.Tensor, Stepper]:
        """First-position logits [rows * repeats, vocab] and a stepper over the rows, each row repeated
        ``repeats`` times (the beams of a question), its streams combined by the strategy's :meth:`Decoding.combine`.
        ``fresh``: tokenized on these rows alone, not as rows of the engine call's tokenization."""


class AttendingRows(DecodingRows, Protocol):
    """Rows whose steppers can also read the last layer's attention (OPERA)."""

    def attending(self, first: torch.Tensor, stepper: Stepper) -> AttentionStepper:
        """``stepper`` wrapped so that each fed (or probed) token's last-layer attention row is read."""

    def image_spans(self) -> list[tuple[int, int]]:
        """Per row, the first and last position of its image tokens in its prompt."""

    def prompt_lengths(self) -> list[int]:
        """Per row, its prompt's token count."""

    def alone(self, row: int) -> "AttendingRows":
        """Row ``row`` as a batch of its own."""


class Decoding:
    """A decoding strategy: what it needs from the engine (class attributes) and how it decodes."""

    #: The variant's ``decoding`` value this class runs (the registry's key).
    name = ""
    #: Streams per row: 1, or 2 where a second (noised) image runs beside the clean one (VCD).
    streams = 1
    #: Whether the language model's last layer must return its attention (eager kernel; OPERA).
    needs_last_attention = False
    #: Whether one engine call may hold several batches' worth of questions (each forward still one batch) where
    #: the family's images share suffix batches; where its decoding rows also read their prefixes in place every
    #: decoding's call does.
    call_spans_batches = False
    #: Whether rows opened on prompts of different widths may decode joined in one batch; False (OPERA, which
    #: reads the decoded tokens' attention columns): only where their decoded tokens start at one column of the
    #: attention rows (the engine's ``prompt_columns``).
    joins_rows = True
    #: Whether the first-position argmax is the answer's first token (then only the answers it does not decide
    #: are decoded further); otherwise every answer is decoded in full.
    decides_by_first_token = False

    def __init__(self, variant: Variant):
        self.variant = variant

    @property
    def beams(self) -> int:
        """Rows per question (beams); each holds its own cache."""
        return 1

    def new_tokens(self, continue_tokens: int) -> int:
        """Tokens decoded per answer, the first included (``continue_tokens``: greedy's continuation)."""
        return self.variant.max_new_tokens

    def keeps_openings(self, continue_tokens: int) -> bool:
        """Whether the scoring pass's rows should be kept as the openings of the decoding that follows it."""
        return True

    def logits_processors(self) -> search.Processors:
        """The hook for per-step logit adjustments (a repetition penalty and the like): transformers'
        ``LogitsProcessor`` objects, or any callable ``(tokens, scores) -> scores``, that every step of this
        decoding applies in order, where ``generate`` applies its ``logits_processor``: greedy and sampling to the
        logits (before sampling's temperature, top-k and top-p), beam search and OPERA to the log-probabilities;
        with VCD on top, to the contrast. ``tokens`` [rows, step] are each row's answer so far, not its prompt;
        the rows are those still answering (answers that ended leave the steps), so keep no state by row position.
        The engine's greedy continuation of an undecided answer decodes with this decoding, processors included;
        its first token stays the scoring pass's argmax (where :attr:`decides_by_first_token`, a processor that
        would change the first step must not be used). None by default."""
        return ()

    def combine(self, stream: Stream) -> tuple[torch.Tensor, Stepper]:
        """The first-position logits and stepper of a batch from its streams (one: the clean image)."""
        return stream(False)

    def decode(self, rows: DecodingRows, new_tokens: int, stop: set[int]) -> search.Decoded:
        """The generated token ids of each row (without its end token) and its first token's probability in the
        distribution the first step drew it from (:class:`~.search.Decoded`)."""
        first, stepper = rows.open(self.beams)
        return self.search(first, stepper, rows, new_tokens, stop)

    def search(self, first: torch.Tensor, stepper: Stepper, rows: DecodingRows, new_tokens: int,
               stop: set[int]) -> search.Decoded:
        raise NotImplementedError


class Greedy(Decoding):
    """The argmax at every step; the first token is the scoring pass's argmax, so only the answers it does not
    decide are continued (``inference.continue_tokens`` more tokens)."""

    name = "greedy"
    call_spans_batches = True
    decides_by_first_token = True

    def new_tokens(self, continue_tokens: int) -> int:
        return continue_tokens + 1

    def keeps_openings(self, continue_tokens: int) -> bool:
        return continue_tokens > 0

    def search(self, first, stepper, rows, new_tokens, stop):
        return search.greedy_search(first, stepper, new_tokens, stop, self.logits_processors())


class BeamSearch(Decoding):
    """transformers' beam search (``num_beams``, ``length_penalty``)."""

    name = "beam"

    @property
    def beams(self) -> int:
        return self.variant.num_beams

    def search(self, first, stepper, rows, new_tokens, stop):
        return search.beam_search(first, stepper, self.beams, new_tokens, stop, self.variant.length_penalty,
                                  self.logits_processors())


class Sampling(Decoding):
    """Temperature, top-k and top-p, each question drawing from its own generator (seeded by its id)."""

    name = "sample"

    def search(self, first, stepper, rows, new_tokens, stop):
        variant = self.variant
        seeds = [question_seed(question_id, variant.seed) for question_id in rows.question_ids]
        return search.sample_search(first, stepper, new_tokens, stop, seeds, variant.temperature, variant.top_k,
                                    variant.top_p, self.logits_processors())
