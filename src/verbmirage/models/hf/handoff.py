"""What a scoring call hands to the decoding of its questions: :class:`Openings`.

The scoring pass of the transformers engine (:meth:`~verbmirage.models.hf.engine.TransformersVLM.answer_logits`)
runs every prompt up to its first answer position. Where a decoding follows on those questions (beam search,
sampling, OPERA; greedy answers whose first token decides nothing), it can continue from the scoring pass's rows
instead of running the prompts again. Those rows travel in an :class:`Openings` that the scoring call returns and
the decoding takes as an argument (:meth:`~verbmirage.models.hf.engine.TransformersVLM.decode_answers`); nothing
of one call stays on the model for the next. A decoding without one opens its rows from the prompts (on the cached image
prefixes where they are kept), with the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: A question's key in a call: (image path, prompt text).
Key = tuple[Path, str]


@dataclass
class Openings:
    """One scoring call's hand-off to its decodings.

    ``kinds``: each question's kind ((image path, prompt) -> multiple choice), which tells which first tokens
    decide an answer. ``kept``: per stream (False: the clean images; True: VCD's noised ones) the rows kept as
    openings, (image path, prompt) -> (stepper, row); None where no decoding continues from the scoring rows
    (plain greedy keeps only its undecided rows, other decodings all of them: ``Decoding.keeps_openings``).
    A decoding takes its rows out (:meth:`take`), so each row's memory frees
    as its question is decoded.
    """

    kinds: dict[Key, bool] = field(default_factory=dict)
    kept: dict[bool, dict[Key, tuple]] | None = None

    @classmethod
    def keeping(cls, kinds: dict[Key, bool]) -> Openings:
        """A hand-off that keeps the scoring rows of both streams."""
        return cls(kinds, {False: {}, True: {}})

    def rows(self, noised: bool) -> dict[Key, tuple]:
        """The kept rows of one stream (empty where none are kept)."""
        return (self.kept or {}).get(noised) or {}

    def keep(self, noised: bool | list[bool], stepper, keys: list[Key], tokens: list[int] | None = None,
             deciding: dict[bool, frozenset[int]] | None = None) -> None:
        """Keep the rows of ``stepper`` (one per key, in order) as openings of their stream (``noised``: one for
        all, or one per row: a scoring batch of VCD's two streams). With ``deciding`` (per kind, the first tokens
        that decide an answer), only the rows whose first token (``tokens``) decides nothing: the only ones a
        greedy decoding continues."""
        streams = noised if isinstance(noised, list) else [noised] * len(keys)
        rows = list(range(len(keys)))
        if deciding is not None:
            rows = [row for row in rows if tokens[row] not in deciding[self.kinds.get(keys[row], False)]]
            stepper = stepper.subset(rows) if rows else None
        for position, row in enumerate(rows):
            self.kept[streams[row]][keys[row]] = (stepper, position)

    def take(self, noised: bool, items: list[tuple], repeats: int, join_group) -> object | None:
        """A stepper on ``items`` ((image path, image, prompt)), each row ``repeats`` times (its beams), from the
        kept openings of one stream, or None: the rows of one scoring batch, or of several joined
        (:meth:`~verbmirage.models.hf.steppers.PrefixStepper.joined`) where ``join_group`` puts every stepper
        in one group (not None: OPERA's rows join only read in place on one prefix length, so that the decoded
        tokens start at one attention column; no rows join where a prefix carries more than its keys and
        values, such as Qwen's rope delta). The rows are copied once, beams included, and leave the hand-off: the
        decoding owns them now, so the scoring batches' rows free as their questions are taken."""
        kept = self.rows(noised)
        found = [kept.get((path, text)) for path, _, text in items] if kept else [None]
        if any(entry is None for entry in found):
            return None
        steppers = {id(stepper): stepper for stepper, _ in found}
        if len(steppers) == 1:
            stepper = found[0][0].subset([row for _, row in found for _ in range(repeats)], repeats)
        elif len(groups := {join_group(stepper) for stepper in steppers.values()}) == 1 and None not in groups:
            stepper = type(found[0][0]).joined([pick for pick in found for _ in range(repeats)], repeats)
        else:
            return None
        for path, _, text in items:
            kept.pop((path, text), None)
        return stepper

    def drop(self) -> None:
        """Free every kept row and keep no more (out of memory): the decodings open their rows from the prompts."""
        for rows in (self.kept or {}).values():
            rows.clear()
        self.kept = None

    def forget(self, keys) -> None:
        """Drop the kept rows of ``keys`` (decoded: their scoring rows are no longer needed)."""
        for rows in (self.kept or {}).values():
            for key in keys:
                rows.pop(key, None)
