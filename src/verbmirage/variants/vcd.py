"""VCD as a strategy: greedy, beam search or sampling on the contrast of a clean and a noised stream.

The numerics (forward diffusion on the pixel tensor, the contrast and its plausibility cut, the KL columns)
are :mod:`.search`'s; this class says what VCD asks of the engine (a second stream per row, its noised image
seeded per image) and wraps the decoding it rides on.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from verbmirage.variants import search
from verbmirage.variants.settings import question_seed
from verbmirage.variants.strategies import Decoding, Stream


class ContrastiveDecoding(Decoding):
    """VCD (Leng et al. 2024) on top of ``inner`` (greedy, beam search or sampling)."""

    name = "vcd"
    streams = 2

    def __init__(self, inner: Decoding):
        super().__init__(inner.variant)
        self.inner, self.settings = inner, inner.variant.vcd
        self.call_spans_batches = inner.call_spans_batches
        self.joins_rows = inner.joins_rows
        self.decides_by_first_token = inner.decides_by_first_token

    @property
    def beams(self) -> int:
        return self.inner.beams

    def new_tokens(self, continue_tokens: int) -> int:
        return self.inner.new_tokens(continue_tokens)

    def logits_processors(self):
        """The inner decoding's, applied to the contrast (the official code applies its processors after it)."""
        return self.inner.logits_processors()

    def keeps_openings(self, continue_tokens: int) -> bool:
        """Not for greedy: the scoring pass keeps the rows its clean argmax leaves undecided, while VCD's first
        token is the contrast's argmax."""
        return not self.inner.decides_by_first_token and self.inner.keeps_openings(continue_tokens)

    @property
    def noise_key(self) -> tuple:
        """What a noised image prefix depends on besides the image and its tokens."""
        return self.settings, self.variant.seed

    def noised_pixels(self, pixels: torch.Tensor, image_path) -> torch.Tensor:
        """``pixels`` (one image's rows) with VCD's diffusion noise, seeded by the image's file name and the
        variant's seed: the same noise for every question of the image."""
        seed = question_seed(Path(image_path).name, self.variant.seed)
        return search.diffuse(pixels, self.settings.noise_step, seed)

    def contrast_first(self, clean: torch.Tensor, noised: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
        """The contrasted first-position logits of each row and its result columns (``vcd_kl``,
        ``vcd_kl_reverse``, ``vcd_plausible``; none where the KL is not finite)."""
        contrasted = search.contrast(clean, noised, self.settings)
        kl, kl_reverse, plausible = search.divergence(clean, contrasted, self.settings.beta)
        columns = [{"vcd_kl": a, "vcd_kl_reverse": b, "vcd_plausible": int(c)} if math.isfinite(a) else {}
                   for a, b, c in zip(kl.tolist(), kl_reverse.tolist(), plausible.tolist())]  # one read each
        return contrasted, columns

    def combine(self, stream: Stream):
        """The contrasted pair of a clean and a noised stream fed the same tokens."""
        first, clean = stream(False)
        first_noised, noised = stream(True)
        return search.contrast(first, first_noised, self.settings), search.ContrastedStepper(
            clean, noised, self.settings, rows=first.shape[0])

    def search(self, first, stepper, rows, new_tokens, stop):
        return self.inner.search(first, stepper, rows, new_tokens, stop)
