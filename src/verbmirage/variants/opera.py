"""OPERA as a strategy: beam search with the over-trust penalty and retrospection (Huang et al. 2024).

The search loops are :func:`.search.opera_batch` and :func:`.search.opera_search`; this class says what OPERA
asks of the engine (the last layer's attention; rows whose decoded tokens start at one attention column) and
decides which questions decode together: a batch whose image tokens sit at one position and whose decoded tokens'
keys start at one column decodes as one, and a question whose retrospection rolls back (or a batch with its image
elsewhere, or its decoded tokens at different columns) decodes alone.
"""

from __future__ import annotations

import logging

from verbmirage.variants import search
from verbmirage.variants.strategies import AttendingRows, Decoding

log = logging.getLogger(__name__)


def placeholder_length(length: int, image_span: tuple[int, int]) -> int:
    """A prompt's token count with its image tokens (``image_span``, inclusive) counted as one placeholder, as
    the official OPERA LLaVA wrapper's prompt holds the image (its length normalisation)."""
    return length - (image_span[1] - image_span[0])


class Opera(Decoding):
    """OPERA: beam search with the over-trust penalty on the attention's columns and retrospection."""

    name = "opera"
    needs_last_attention = True
    joins_rows = False  # its columns (image span, prompt end) must be every row's

    @property
    def beams(self) -> int:
        return self.variant.num_beams

    def decode(self, rows: AttendingRows, new_tokens: int, stop: set[int]) -> search.Decoded:
        """A batch of questions (:func:`.search.opera_batch`); a question whose retrospection rolls back, or a
        batch whose image tokens sit at different positions or whose rows' decoded tokens start at different
        attention columns (``prompt_columns`` None), decodes alone (:meth:`decode_alone`)."""
        spans = set(rows.image_spans())
        variant, beams = self.variant, self.beams
        first, stepper = rows.open(beams, fresh=True) if len(rows.question_ids) > 1 and len(spans) == 1 \
            else (None, None)
        if stepper is None or stepper.prompt_columns is None:
            del first, stepper  # (its rows free before the questions reopen alone)
            return search.Decoded.joined([self.decode_alone(rows.alone(i), new_tokens, stop)
                                          for i in range(len(rows.question_ids))])
        attending = rows.attending(first, stepper)  # (OPERA does not combine with VCD: one stream)
        span = spans.pop()
        decoded = search.opera_batch(
            first, attending, variant.opera, beams, new_tokens, stop, span, stepper.prompt_columns,
            [placeholder_length(n, span) for n in stepper.prompt_lengths[::beams]], variant.length_penalty,
            self.logits_processors())
        return search.Decoded.joined([row if row is not None else self.decode_alone(rows.alone(i), new_tokens, stop)
                                      for i, row in enumerate(decoded)])

    def decode_alone(self, one: AttendingRows, new_tokens: int, stop: set[int]) -> search.Decoded:
        """One question (:func:`.search.opera_search`), reopened from its prompt at each rollback."""
        variant, beams = self.variant, self.beams
        length = one.prompt_lengths()[0]

        def reopen():
            first, stepper = one.open(beams, fresh=True)
            return one.attending(first, stepper)

        opened = reopen()
        span = one.image_spans()[0]
        # where the decoded tokens' keys start in the attention rows: the prompt's length when it was opened
        # alone, further right when its row comes from a wider scoring batch (the normalisation keeps the length)
        columns = opened.prompt_columns if opened.prompt_columns is not None else length
        decoded, rollbacks = search.opera_search(
            opened.first, opened, variant.opera, beams, new_tokens, stop, span, columns, reopen,
            variant.length_penalty, normalised_length=placeholder_length(length, span),
            processors=self.logits_processors())
        if rollbacks:
            log.info("%s: OPERA rolled back %d time(s): %s", one.name, len(rollbacks), rollbacks)
        return decoded
