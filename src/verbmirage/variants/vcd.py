"""VCD (Leng et al. 2024): greedy, beam search or sampling on the contrast of a clean and a noised stream.

Here are its numerics (forward diffusion on the pixel tensor, the contrast and its plausibility cut, the KL
columns), :class:`ContrastedStepper` (the two streams as one stepper, so that every loop of :mod:`.search`
decodes on the contrast unchanged) and :class:`ContrastiveDecoding`, which says what VCD asks of the engine (a
second stream per row, its noised image seeded per image) and wraps the decoding it rides on.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from verbmirage.variants.search import Stepper
from verbmirage.variants.settings import VCDSettings, question_seed
from verbmirage.variants.strategies import Decoding, Stream

# ---- the numerics (docs/variants.md, "How the engine decodes") ----------------------------------------------------
DIFFUSION_STEPS = 1000


def diffusion_coefficients(step: int) -> tuple[float, float]:
    """(sqrt(abar_t), sqrt(1 - abar_t)) of VCD's forward diffusion at ``step`` (0-based, of 1000).

    betas = sigmoid(linspace(-6, 6, 1000)) * (5e-3 - 1e-5) + 1e-5; abar_t = prod_{s<=t} (1 - beta_s).
    """
    if not 0 <= step < DIFFUSION_STEPS:
        raise ValueError(f"vcd.noise_step: {step} is not in 0..{DIFFUSION_STEPS - 1}")
    betas = 1 / (1 + np.exp(-np.linspace(-6, 6, DIFFUSION_STEPS))) * (5e-3 - 1e-5) + 1e-5
    alpha_bar = float(np.cumprod(1 - betas)[step])
    return math.sqrt(alpha_bar), math.sqrt(1 - alpha_bar)


def diffuse(pixels: torch.Tensor, step: int, seed: int) -> torch.Tensor:
    """VCD's distorted image: x_t = sqrt(abar) x + sqrt(1 - abar) eps on the normalised pixel tensor, no clipping.

    ``eps`` is drawn from a generator seeded with ``seed`` (one per image), on the CPU, so the same
    image gets the same noise in any batch, shard or device. (The official code draws fresh noise per
    question from one global generator; seeding per image lets every question of an image share one
    noised prefix: a documented deviation, docs/variants.md.)
    """
    keep, noise = diffusion_coefficients(step)
    generator = torch.Generator().manual_seed(seed)
    eps = torch.randn(pixels.shape, generator=generator, dtype=torch.float32)
    noised = keep * pixels.float().cpu() + noise * eps
    return noised.to(device=pixels.device, dtype=pixels.dtype)


def contrast(clean: torch.Tensor, noised: torch.Tensor, settings: VCDSettings) -> torch.Tensor:
    """VCD's next-token logits: (1 + alpha) l - alpha l', -inf where p_clean < beta * p_clean_max.

    The plausibility cut is log(beta) + max(l) on the raw clean logits (beta = 0: no cut). float32.
    """
    clean, noised = clean.float(), noised.float()
    contrasted = (1 + settings.alpha) * clean - settings.alpha * noised
    return contrasted.masked_fill(~plausible_tokens(clean, settings.beta), -math.inf)


def plausible_tokens(clean: torch.Tensor, beta: float) -> torch.Tensor:
    """Tokens VCD keeps: clean probability at least ``beta`` times the top one."""
    if beta <= 0:
        return torch.ones_like(clean, dtype=torch.bool)
    cutoff = math.log(beta) + clean.max(dim=-1, keepdim=True).values
    return clean >= cutoff


def divergence(clean: torch.Tensor, contrasted: torch.Tensor, beta: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: KL(q || p~), KL(p~ || q) and the plausibility-set size.

    q = softmax(contrasted); p~ = the clean distribution restricted to the plausibility set and renormalised
    (the definition under which "KL exactly 0" can happen: a one-token set, or a contrast that moves nothing;
    docs/analysis.md, "VCD divergence"). Both directions, since the paper's "KL divergence between the original
    p_theta and the contrasted p_vcd" does not say which; they are 0 together (q = p~). float64.
    """
    keep = plausible_tokens(clean.float(), beta)
    log_q = torch.log_softmax(contrasted.double(), dim=-1)
    log_p = torch.log_softmax(clean.double().masked_fill(~keep, -math.inf), dim=-1)
    zero = torch.zeros_like(log_q)
    forward = torch.where(keep, log_q.exp() * (log_q - log_p), zero).sum(dim=-1).clamp_min(0.0)
    reverse = torch.where(keep, log_p.exp() * (log_p - log_q), zero).sum(dim=-1).clamp_min(0.0)
    return forward, reverse, keep.sum(dim=-1)


class ContrastedStepper:
    """VCD: a clean and a noised stream fed the same tokens; returns :func:`contrast` of their logits.

    Where the clean stepper offers ``stepped_with(noised)`` (a stepper over its rows and then the noised one's,
    or None), both streams step in one forward of twice the rows instead of two."""

    def __init__(self, clean: Stepper, noised: Stepper, settings: VCDSettings, rows: int):
        self.clean, self.noised, self.settings = clean, noised, settings
        #: each stream's rows (where the streams step joined, the noised rows follow this many clean ones)
        self.rows = rows
        join = getattr(clean, "stepped_with", None)
        self.both = join(noised) if join is not None else None
        if self.both is not None:  # the joined stepper holds copies of both: the streams' own rows can go
            self.clean = self.noised = None

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.both is None:
            return contrast(self.clean.advance(tokens), self.noised.advance(tokens), self.settings)
        clean, noised = self.both.advance(torch.cat([tokens, tokens])).chunk(2)
        return contrast(clean, noised, self.settings)

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i of each stream continues from row ``rows[i]`` of it (beams moving, or fewer rows: those that
        ended leave)."""
        if self.both is None:
            self.clean.reorder(rows)
            self.noised.reorder(rows)
        else:
            self.both.reorder(torch.cat([rows, rows + self.rows]))
        self.rows = len(rows)

    def repeat(self, times: int) -> None:
        """Each row ``times`` times in a row (the beams of a question), in both streams."""
        self.rows *= times
        if self.both is None:
            self.clean.repeat(times)
            self.noised.repeat(times)
        else:  # [clean rows, noised rows], each repeated in place: the halves stay clean and noised
            self.both.repeat(times)


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
        return diffuse(pixels, self.settings.noise_step, seed)

    def contrast_first(self, clean: torch.Tensor, noised: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
        """The contrasted first-position logits of each row and its result columns (``vcd_kl``,
        ``vcd_kl_reverse``, ``vcd_plausible``; none where the KL is not finite)."""
        contrasted = contrast(clean, noised, self.settings)
        kl, kl_reverse, plausible = divergence(clean, contrasted, self.settings.beta)
        columns = [{"vcd_kl": a, "vcd_kl_reverse": b, "vcd_plausible": int(c)} if math.isfinite(a) else {}
                   for a, b, c in zip(kl.tolist(), kl_reverse.tolist(), plausible.tolist())]  # one read each
        return contrasted, columns

    def combine(self, stream: Stream):
        """The contrasted pair of a clean and a noised stream fed the same tokens."""
        first, clean = stream(False)
        first_noised, noised = stream(True)
        return contrast(first, first_noised, self.settings), ContrastedStepper(
            clean, noised, self.settings, rows=first.shape[0])

    def search(self, first, stepper, rows, new_tokens, stop):
        return self.inner.search(first, stepper, rows, new_tokens, stop)
