"""The engine's side of decoding: it opens the rows a decoding strategy asks for (on the cached image prefixes,
from the scoring pass's kept rows, or from whole prompts), hands them to the strategy
(:mod:`verbmirage.variants.strategies`) as :class:`DecodeRows`, and records the answers.

:class:`Decoder` is a collaborator of :class:`~verbmirage.models.hf.engine.TransformersVLM`.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import numpy as np
import torch

from verbmirage.models.base import Question
from verbmirage.models.hf.handoff import Openings
from verbmirage.models.hf.inputs import PromptInputs
from verbmirage.models.hf.prefix_cache import PrefixCache, Rows
from verbmirage.models.hf.scoring import DecodedAnswer
from verbmirage.models.hf.steppers import AttendingStepper, FullStepper, InPlaceStepper, PrefixStepper, StepperHost
from verbmirage.variants.search import Decoded


class DecodeRows:
    """The questions of one decoding batch as a strategy sees them
    (:class:`~verbmirage.variants.strategies.AttendingRows`): ``items`` are (image path, image, prompt text);
    ``opened`` (``opened_noised``): the call's tokenization of the clean (noised) images and these rows' indices
    in it; ``openings``: the scoring call's hand-off, whose kept rows these questions start from where it has
    them."""

    def __init__(self, decoder: Decoder, strategy, items: list[tuple], question_ids: list[str],
                 opened: tuple[Rows, list[int]] | None = None, opened_noised: tuple[Rows, list[int]] | None = None,
                 openings: Openings | None = None):
        self.decoder, self.vlm = decoder, decoder.engine
        self.strategy, self.items, self.question_ids = strategy, items, question_ids
        self.opened, self.opened_noised, self.name = opened, opened_noised, self.vlm.name
        self.openings = openings

    def open(self, repeats: int, fresh: bool = False):
        if fresh:
            return self.decoder.open_stepper(self.items, repeats, self.strategy, None, None, self.openings)
        return self.decoder.open_stepper(self.items, repeats, self.strategy, self.opened, self.opened_noised,
                                         self.openings)

    def attending(self, first: torch.Tensor, stepper):
        """``stepper`` reading the last layer's attention: an :class:`InPlaceStepper` computes it itself; other
        steppers run the language model eagerly with a hook on its last layer (:meth:`TransformersVLM.
        keep_last_attention`)."""
        if isinstance(stepper, InPlaceStepper):
            stepper.records_attention = True
            stepper.probe_feeds = self.vlm.opera_one_forward  # on CUDA: hf/on_device.py
            return stepper
        self.vlm.keep_last_attention()
        return AttendingStepper(self.vlm, stepper, first)

    def image_spans(self) -> list[tuple[int, int]]:
        return [self.decoder.image_span(image, text) for _, image, text in self.items]

    def prompt_lengths(self) -> list[int]:
        return [len(self.vlm.prompt_ids(text, image)) for _, image, text in self.items]

    def alone(self, row: int) -> "DecodeRows":
        return DecodeRows(self.decoder, self.strategy, [self.items[row]], [self.question_ids[row]],
                          openings=self.openings)


class DecoderHost(StepperHost, Protocol):
    """What :class:`Decoder` and its :class:`DecodeRows` need of their engine
    (:class:`~verbmirage.models.hf.engine.TransformersVLM`), the steppers' needs among them (:class:`~.steppers.
    StepperHost`: the steppers they open get the engine). The decoding strategy is an argument of each call."""

    continue_tokens: int
    batch_rows: int | None
    cross_image_batches: bool
    inputs: PromptInputs  # its opened images (open_items)
    prefix_cache: PrefixCache  # the rows on the kept prefixes (open_rows, rows_cache, reads_in_place)
    deciding_tokens: dict[bool, frozenset[int]]
    opera_one_forward: bool  # OPERA's step in one forward (hf/on_device.py)

    def render(self, question: Question, multiple_choice: bool | None) -> str: ...
    def encode_shared_image(self, texts: list[str], image) -> dict: ...
    def prompt_ids(self, text: str, image) -> np.ndarray: ...
    def keep_last_attention(self) -> None: ...
    def with_shrinking_batches(self, method, items: list, size: int | None = None, combine=..., openings=None): ...
    def real_tokens(self, logits: torch.Tensor) -> torch.Tensor: ...
    def noised_inputs(self, encoded: dict, image_path) -> dict: ...
    def image_token_id(self) -> int: ...
    def stop_tokens(self) -> set[int]: ...


class Decoder:
    """Decoding past the first answer token, a collaborator of the transformers engine (its ``decoder``): from
    the rows a scoring call kept (``openings``: the :class:`~.handoff.Openings` it returned), else from the
    prompts. It reads of the engine only what :class:`DecoderHost` declares."""

    def __init__(self, engine: DecoderHost):
        self.engine = engine

    def kept_opening(self, opened: Rows, batch: list[int], items: list[tuple], openings: Openings,
                     strategy) -> torch.Tensor:
        """Scores a suffix batch as :meth:`~.prefix_cache.PrefixCache.suffix_batch` does, as the opening of a
        decoding by ``strategy`` kept in ``openings`` (greedy: the rows whose first token cannot decide their
        kind), each row under its stream (VCD's clean or noised images)."""
        stepper = self.prefix_stepper(opened, batch, strategy)
        values = stepper.first.cpu()
        deciding = self.engine.deciding_tokens if strategy.decides_by_first_token else None
        keys = [(items[opened.item(row)][0], items[opened.item(row)][2]) for row in batch]
        openings.keep([opened.noised(row) for row in batch], stepper, keys,
                      deciding and self.engine.real_tokens(values).argmax(dim=-1).tolist(), deciding)
        return values

    def prefix_stepper(self, opened: Rows, rows: list[int], strategy):
        """A stepper opened on ``rows`` of ``opened`` (all on cached prefixes) for ``strategy``: prefixes read in
        place where the family allows it (:meth:`~.prefix_cache.PrefixCache.reads_in_place`), else a copy of its
        prefix per row."""
        engine = self.engine
        prefixes, image_of_row = opened.prefixes_of(rows)
        suffixes = [opened.suffix[i] for i in rows]
        if engine.prefix_cache.reads_in_place():
            return InPlaceStepper(engine, prefixes, image_of_row, [opened.prefix_length[i] for i in rows], suffixes,
                                  reserve=strategy.new_tokens(engine.continue_tokens))
        lengths = sorted({opened.prefix_length[i] for i in rows})
        if len(lengths) != 1:  # the copies share one cache width: callers group rows by prefix length
            raise ValueError(f"models.{engine.name}: a copied-prefix batch needs one prefix length, not {lengths}")
        return PrefixStepper(engine, engine.prefix_cache.rows_cache(prefixes, image_of_row), lengths[0], suffixes,
                             prefixes[0].extra)

    @staticmethod
    def _join_group(strategy, stepper) -> tuple | None:
        """Which kept openings the rows of this one may decode joined with under ``strategy``: those of the same
        group, or none (None). Rows of any prompt widths where the strategy allows it
        (:attr:`~verbmirage.variants.strategies.Decoding.joins_rows`); under a strategy that reads the decoded
        tokens' attention columns (OPERA), rows read in place on one prefix length, whose joined stepper's
        decoded tokens start at one column (:meth:`~.steppers.InPlaceStepper.joined`; copied prefixes,
        right-padded to the longest cache when joined, do not join for it). Never where a prefix carries more
        than its keys and values (Qwen's rope delta)."""
        if stepper.extra is not None:
            return None
        if strategy.joins_rows:
            return ()
        width = stepper.prefix_width() if isinstance(stepper, InPlaceStepper) else None
        return None if width is None else (width,)

    @torch.inference_mode()
    def decode(self, questions: list[Question], multiple_choice: bool, strategy,
               openings: Openings | None = None) -> list[DecodedAnswer]:
        """Questions decode in one batch per image on its cached prefix (all images of the call together with the
        engine's :attr:`~.engine.TransformersVLM.cross_image_batches`), expanded per row and beam: the prompts' own
        tokens run once more to open the rows. Without a shared prefix (InstructBLIP), one batch per image and
        prompt length.

        ``strategy``: the :class:`~verbmirage.variants.strategies.Decoding` that decodes them."""
        openings = openings or Openings()  # no hand-off: every row opens from its prompt
        new_tokens = strategy.new_tokens(self.engine.continue_tokens)
        answers: list[DecodedAnswer] = [DecodedAnswer(None, "", math.nan)] * len(questions)
        texts = [self.engine.render(q, multiple_choice) for q in questions]
        errors, items = self.engine.inputs.open_items(questions, texts)
        for i, error in enumerate(errors):
            if error is not None:
                raise ValueError(error)
        stop = self.engine.stop_tokens()
        kept = openings.rows(False)
        opened = None if all((path, text) in kept for path, _, text in items) \
            else self.engine.prefix_cache.open_rows(items, False)
        kept_noised = openings.rows(True)
        opened_noised = self.engine.prefix_cache.open_rows(items, True) if strategy.streams > 1 and opened is not None \
            and not all((path, text) in kept_noised for path, _, text in items) else None
        batches: dict[tuple, list[int]] = {}
        for i, item in enumerate(items):
            if (item[0], item[2]) in kept:  # rows of the scoring batches: the decoding starts from them
                source = kept[item[0], item[2]][0]  # (no local name keeps it: its rows free once taken)
                group = self._join_group(strategy, source)
                key = ("kept", id(source)) if group is None else ("kept", *group)
                del source
            elif opened.suffix[i] is None:  # whole prompts: one batch per image and token length
                key = ("full", item[0], opened.length[i])
            else:
                key = ("prefix", opened.prefix_length[i] if self.engine.cross_image_batches
                       else opened.prefix_key[i])
            batches.setdefault(key, []).append(i)

        def run(rows: list[int]) -> Decoded:
            decoding = DecodeRows(self, strategy, [items[i] for i in rows], [questions[i].question_id for i in rows],
                                  opened and (opened, rows), opened_noised and (opened_noised, rows), openings)
            return strategy.decode(decoding, new_tokens, stop)

        in_place = self.engine.prefix_cache.reads_in_place()
        for key, rows in batches.items():
            # every beam (and VCD's second stream) holds its own cache: copies of the prefix (PrefixStepper) allow
            # at most as many rows as a batch has questions (the call's, or batch_rows when the call is larger),
            # the memory it was chosen for; rows that read their prefixes in place (InPlaceStepper) hold only
            # their own columns, a tenth of a copy or less (LLaVA: a 577-token prefix, 20-80 own columns; a beam
            # only its decoded ones, its question's prompt columns shared), so all the batch's questions decode
            # together, and the rows a decoding of every answer kept from the scoring batches (their openings'
            # forwards done) all the call's: its questions share every step forward (greedy's continuations,
            # which the memory estimate counts per batch, decode a batch at a time)
            size = min(len(questions), self.engine.batch_rows or len(questions))
            if not in_place:
                size //= strategy.beams * strategy.streams
            elif key[0] == "kept" and not strategy.decides_by_first_token:
                size = len(rows)
            self._record(answers, rows, self.engine.with_shrinking_batches(run, rows, size, combine=Decoded.joined,
                                                                    openings=openings))
        openings.forget([(path, text) for path, _, text in items])  # decoded: their scoring rows are not needed
        return answers

    def _record(self, answers: list, rows: list[int], decoded: Decoded) -> None:
        for i, row, probability in zip(rows, decoded.tokens, decoded.first_probability):
            text = self.engine.tokenizer.decode(row, skip_special_tokens=True)
            answers[i] = DecodedAnswer(row[0] if row else None, text, probability)

    def image_span(self, image, text: str) -> tuple[int, int]:
        """First and last position of the image tokens in the prompt."""
        positions = np.flatnonzero(self.engine.prompt_ids(text, image) == self.engine.image_token_id())
        if len(positions) == 0:
            raise ValueError(f"models.{self.engine.name}: OPERA needs the image tokens in the prompt, found none")
        return int(positions[0]), int(positions[-1])

    def open_stepper(self, items: list[tuple], repeats: int, strategy, opened: tuple[Rows, list[int]] | None = None,
                     opened_noised: tuple[Rows, list[int]] | None = None, openings: Openings | None = None):
        """First-position logits [rows, vocab] and the stepper of ``items`` ((image path, image, text): prompts
        on one prefix length, or of one image and one token length), each row repeated ``repeats`` times;
        the streams combined by ``strategy`` (VCD: the contrasted pair of a clean and a noised stream).
        ``opened`` (``opened_noised``): the items already tokenized, as rows of a
        :meth:`~.prefix_cache.PrefixCache.open_rows` result of the clean (noised) images. Both come from the same
        items, so the noised rows split into prefix and suffix where the clean ones do (a shared text header is
        chosen over all the items: opened again on a batch's rows alone, its rows could differ in prefix length)."""
        # several streams (VCD) with beams: the streams open one row per question and join (one forward for both),
        # and then the joined rows repeat per beam: one copy of the beams' rows, not one per stream and a joined one
        times = repeats if strategy.streams > 1 else 1

        def stream(noised: bool):
            return self._stream(items, repeats // times, strategy, noised=noised,
                                opened=opened_noised if noised else opened, openings=openings)

        first, stepper = strategy.combine(stream)
        if times > 1:
            stepper.repeat(times)
            first = first.repeat_interleave(times, dim=0)
        return first, stepper

    def _stream(self, items: list[tuple], repeats: int, strategy, noised: bool,
                opened: tuple[Rows, list[int]] | None = None, openings: Openings | None = None):
        """A stepper over ``items``: the scoring pass's (kept in ``openings``), else on the cached image prefixes (any
        prompt lengths), else whole prompts."""
        stepper = openings.take(noised, items, repeats, functools.partial(self._join_group, strategy)) if openings \
            else None
        if stepper is not None:
            return stepper.first, stepper
        opened, rows = opened or (self.engine.prefix_cache.open_rows(items, noised), list(range(len(items))))
        if not any(opened.suffix[i] is None for i in rows):
            stepper = self.prefix_stepper(opened, rows, strategy)
            stepper.repeat(repeats)  # each prompt runs once; its beams start from copies of its cache
            return stepper.first, stepper
        image_path, image, _ = items[0]
        encoded = self.engine.encode_shared_image([text for *_, text in items], image)
        if noised:
            encoded = self.engine.noised_inputs(encoded, image_path)
        repeated = {key: value.repeat_interleave(repeats, 0) if isinstance(value, torch.Tensor) else value
                    for key, value in encoded.items()}
        if "image_grid_thw" in encoded:  # Qwen: patches are rows of pixel_values, one grid per image
            repeated["pixel_values"] = encoded["pixel_values"].repeat(repeats, 1)
            repeated["image_grid_thw"] = encoded["image_grid_thw"].repeat(repeats, 1)
        stepper = FullStepper(self.engine, repeated)
        return stepper.first, stepper
