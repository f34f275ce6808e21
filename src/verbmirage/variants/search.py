"""Decoding past the first answer token: greedy, beam search, sampling and OPERA's loops.

The loops run on a :class:`Stepper`: an object holding one key/value cache
per row (a question, or one beam of it) that returns the next-token logits
for the tokens it is fed and reorders its rows when beams move. The engine
(``models/hf/``) builds steppers on its cached image prefix, so beam search
expands the prefix per beam instead of recomputing it; VCD is a stepper that
runs two streams (clean and noised image) and returns the contrasted logits
(:mod:`.vcd`), so it combines with every loop unchanged.

Why our own loops and not ``generate``: ``generate`` cannot start from a
prefix cache shared by many prompts, has no hook for a second (noised) stream
that must follow beam reordering, and draws samples from one global generator,
so a question's sample would depend on its batch. The loops keep the semantics
of transformers 5.x (tested token for token against ``generate``): greedy =
argmax; beam search = its vectorised beam search (``length_penalty`` on the
generated length, ``early_stopping=False`` heuristic, ``2 * num_beams``
candidates per step); sampling = temperature, top-k, top-p warpers, then a
draw from each question's own generator.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

# ---- the loops -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decoded:
    """What a loop decoded, per row: its tokens up to (not including) its end token, and the probability of its
    first token (the end token, for an answer that ended at once) in the distribution the first step drew it
    from: greedy and beam search the softmax of the first logits, sampling that of the warped logits (temperature,
    top-k, top-p), OPERA that of its penalised candidates; VCD's first logits are already the contrast after the
    plausibility cut. This is the answer's ``confidence`` (docs/models.md, "Score and decision")."""

    tokens: list[list[int]]
    first_probability: list[float]

    @staticmethod
    def joined(parts: Sequence[Decoded]) -> Decoded:
        """The rows of ``parts`` one after the other."""
        return Decoded([row for part in parts for row in part.tokens],
                       [value for part in parts for value in part.first_probability])


def _chosen_probability(probabilities: torch.Tensor, rows: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """probabilities[row, token] of each (row, token); NaN where no token was chosen (negative id)."""
    rows, tokens = list(rows)[: len(tokens)], list(tokens)[: len(rows)]
    # one gather and one read to the host for all rows (not a read per row: each waits on a GPU)
    values = probabilities.detach()[rows, [max(token, 0) for token in tokens]].tolist() if rows else []
    return [value if token >= 0 else math.nan for value, token in zip(values, tokens)]


class Stepper(Protocol):
    """Rows of cached decoding state (a question, or a beam of it)."""

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; the float32 logits [rows, vocab] of the next position."""

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i continues from row ``rows[i]`` (beam search)."""


def _cut_at_stop(tokens: list[int], stop: set[int]) -> list[int]:
    for position, token in enumerate(tokens):
        if token in stop:
            return tokens[:position]
    return tokens


#: Per-step logit adjustments (a decoding's :meth:`~.strategies.Decoding.logits_processors`): callables
#: ``(tokens, scores) -> scores`` with transformers' ``LogitsProcessor`` signature, ``tokens`` [rows, step] each row's
#: answer so far (not its prompt), applied in order. The rows are those still answering (answers that ended leave
#: the steps), so a processor reads each row's own tokens and must not keep state by row position.
Processors = Sequence


def adjusted(processors: Processors, tokens: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``scores`` [rows, vocab] through each of ``processors`` in turn (``tokens``: each row's answer so far)."""
    if processors:
        tokens = tokens.to(scores.device)
        for processor in processors:
            scores = processor(tokens, scores)
    return scores


def _one_token_per_row(first: torch.Tensor, stepper: Stepper, max_new_tokens: int, stop: set[int],
                       choose) -> Decoded:
    """Rows decoded one token per step by ``choose(tokens so far, logits, first step?, rows) -> (next tokens, on
    the first step each one's probability in the distribution it was chosen from, else None)`` until every row
    has stopped or ``max_new_tokens``; tokens up to (not including) a stop token. ``rows`` are the indices (into
    ``first``'s rows) of the rows still decoding, whose logits ``choose`` is given: a row that chose a stop
    token leaves the stepper (:meth:`Stepper.reorder` to the rest), so that later steps compute only the rows
    still answering (a trained model's YN answers end after a token or two; one long answer no longer keeps the
    whole batch stepping)."""
    rows = first.shape[0]
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long)
    tokens = torch.full((rows, max_new_tokens), -1, dtype=torch.long)  # -1 after a row's stop token
    alive = torch.arange(rows)
    logits, first_probability = first, []
    for step in range(max_new_tokens):
        chosen, probability = choose(tokens[alive, :step], logits, step == 0, alive)
        if step == 0:
            first_probability = probability.tolist()
        tokens[alive, step] = chosen
        ended = torch.isin(chosen, stop_ids)
        if bool(ended.all()) or step + 1 == max_new_tokens:
            break
        if bool(ended.any()):
            going = (~ended).nonzero()[:, 0]
            stepper.reorder(going)
            alive, chosen = alive[going], chosen[going]
        logits = stepper.advance(chosen)
    return Decoded([_cut_at_stop([token for token in row if token >= 0], stop) for row in tokens.tolist()],
                   first_probability)


def greedy_search(first: torch.Tensor, stepper: Stepper, max_new_tokens: int, stop: set[int],
                  processors: Processors = ()) -> Decoded:
    """Argmax decoding of every row from its first-position logits, after ``processors`` (:func:`adjusted`)."""
    def argmax(tokens, logits, first, rows):  # on the logits' device: only the chosen tokens (and first probability) move
        logits = adjusted(processors, tokens, logits)
        chosen = logits.argmax(-1)
        if not first:  # a later step's probabilities are not kept: no softmax over the vocabulary, no second copy
            return chosen.cpu(), None
        return chosen.cpu(), torch.softmax(logits.float(), dim=-1).gather(-1, chosen[:, None])[:, 0].cpu()

    return _one_token_per_row(first, stepper, max_new_tokens, stop, argmax)


def sample_search(first: torch.Tensor, stepper: Stepper, max_new_tokens: int, stop: set[int],
                  seeds: list[int], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  processors: Processors = ()) -> Decoded:
    """Multinomial sampling, one generator per row seeded with ``seeds[row]``: a row's tokens do not depend on
    which rows share its batch. ``processors`` (:func:`adjusted`) and then the warpers (transformers' own) are
    applied to the logits in the order of ``generate``: processors, temperature, top-k, top-p."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList(processors)
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def draw(tokens, logits, first, rows):
        # torch.multinomial(row, 1, generator) is argmax(row / q), q ~ Exp(1) drawn from the row's generator: the
        # same draws and tokens, with one call per row (its own generator) instead of a multinomial each. The
        # draws come first: they do not depend on the logits, so on a GPU the host draws while the device still
        # computes the step (nothing before them waits on it); they stay on the host, where each question's
        # generator is, so a question draws the same on any device and in any batch.
        noise = torch.empty(logits.shape, dtype=torch.float32)
        for row, question in zip(noise, rows.tolist()):
            row.exponential_(generator=generators[question])
        # the warpers, the softmax and the choice on the logits' device: only the chosen tokens come back
        warped = warpers(tokens.to(logits.device), logits.float()) if warpers else logits.float()
        probabilities = torch.softmax(warped, dim=-1)
        chosen = (probabilities / noise.to(logits.device)).argmax(dim=-1)
        picked = probabilities.gather(-1, chosen[:, None])[:, 0] if first else None
        # the tokens come back in one read, -1 marking a row whose probabilities are not finite
        chosen = torch.where(torch.isfinite(probabilities).all(dim=-1), chosen, -1).cpu()
        if bool((chosen < 0).any()):
            raise ValueError("sampling: a row's probabilities are not finite (every token masked?)")
        return chosen, None if picked is None else picked.cpu()

    return _one_token_per_row(first, stepper, max_new_tokens, stop, draw)


class BeamBook:
    """The bookkeeping of transformers 5.x vectorised beam search, one step at a time (shared by
    :func:`beam_search` and :func:`opera_search`).

    Per step: add the running beam scores to the step's log-probabilities, keep the best
    ``max(2, 1 + #stop) * K`` continuations over all beams; those ending in a stop token (or reaching
    ``max_new_tokens``) among the best K join the finished hypotheses with score / length **
    ``length_penalty`` (length = generated tokens + ``length_offset``: 0 as in transformers 5.x, the prompt
    length for the official OPERA code's full-length normalisation); the best K unfinished continue.

    The book lives on ``device``, the step logits' (beam search keeps a GPU's logits there: no copy of the
    vocabulary-wide scores to the CPU per step).
    """

    def __init__(self, batch: int, k: int, max_new_tokens: int, stop: set[int], length_penalty: float = 1.0,
                 length_offset: int = 0, device: torch.device | str = "cpu"):
        self.batch, self.k, self.max_new_tokens = batch, k, max_new_tokens
        self.length_penalty, self.length_offset = length_penalty, length_offset
        self.keep = max(2, 1 + len(stop)) * k
        self.stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=device)
        self.running = torch.full((batch, k, max_new_tokens), -1, dtype=torch.long, device=device)
        self.running_scores = torch.zeros((batch, k), device=device)
        self.running_scores[:, 1:] = -1e9
        self.finished = self.running.clone()
        self.finished_scores = torch.full((batch, k), -1e9, device=device)
        self.is_finished = torch.zeros((batch, k), dtype=torch.bool, device=device)
        self.improvable = torch.ones((batch, 1), dtype=torch.bool, device=device)
        self.among_best = torch.arange(self.keep, device=device) < k
        self.offsets = torch.arange(batch, device=device)[:, None] * k
        #: after :meth:`step`: the row each running beam continues from, and the token it feeds next
        self.rows = torch.arange(batch * k, device=device)
        self.tokens = torch.zeros(batch * k, dtype=torch.long, device=device)

    def answers(self, step: int) -> torch.Tensor:
        """The running beams' tokens before step ``step`` [batch * K, step], in the order of the rows that step's
        logits come from (what :func:`adjusted` hands the processors)."""
        return self.running[:, :, :step].reshape(self.batch * self.k, step)

    def rows_of(self, questions: torch.Tensor) -> torch.Tensor:
        """The book's rows of ``questions``' beams, question-major."""
        return (questions[:, None] * self.k + torch.arange(self.k)).flatten()

    def spread(self, values: torch.Tensor, held: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``values`` of the beams of questions ``held`` (the stepper's rows, in its order) at their rows of the
        book, the other questions' rows ``fill`` (questions that left the stepper: neutral, nothing of theirs that
        is read changes)."""
        if len(held) == self.batch:
            return values
        rows = self.rows_of(held).to(values.device)
        return values.new_full((self.batch * self.k, *values.shape[1:]), fill).index_copy_(0, rows, values)

    def continuing(self, held: torch.Tensor, going: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After :meth:`step`, the stepper holding the beams of questions ``held`` (in its order) and those of
        ``going`` (some of them, in the same order) to go on: the book's rows of ``going``'s running beams, and
        the stepper's row each continues from (one of its own question's)."""
        targets = self.rows_of(going)
        sources = self.rows.cpu()[targets]
        place = torch.empty(self.batch, dtype=torch.long)
        place[held] = torch.arange(len(held))
        return targets, place[sources // self.k] * self.k + sources % self.k

    def _length(self, generated: int) -> float | torch.Tensor:
        length = (generated + self.length_offset) ** self.length_penalty
        # per-question offsets (opera_batch, float64): the float32 of the same double as a scalar offset gives
        return length.float() if isinstance(length, torch.Tensor) else length

    def step(self, log_probs: torch.Tensor, step: int) -> bool:
        """Take step ``step`` (0-based) from the rows' log-probabilities [batch * K, vocab]; False when done. A
        question that could no longer improve before this step is done: its finished hypotheses stay as they are
        whatever its rows' log-probabilities (:func:`beam_search` gives it none to compute)."""
        batch, k = self.batch, self.k
        done = ~self.improvable
        vocab = log_probs.shape[-1]
        totals = (log_probs.view(batch, k, vocab) + self.running_scores[:, :, None]).view(batch, k * vocab)
        top_scores, top_index = torch.topk(totals, self.keep)
        origin, token = top_index // vocab, top_index % vocab
        candidates = torch.take_along_dim(self.running, origin[:, :, None], dim=1)
        candidates[:, :, step] = token
        ends = torch.isin(token, self.stop_ids) | (step + 1 >= self.max_new_tokens)
        self.ends = ends  # per question: which of the step's candidates ended (opera_batch's stopping rule)
        open_scores = top_scores + ends.float() * -1e9  # the best K unfinished continue
        chosen = torch.topk(open_scores, k).indices
        self.running = torch.take_along_dim(candidates, chosen[:, :, None], dim=1)
        self.running_scores = torch.take_along_dim(open_scores, chosen, dim=1)
        self.rows = (torch.take_along_dim(origin, chosen, dim=1) + self.offsets).flatten()
        self.tokens = self.running[:, :, step].flatten()
        scores = top_scores / self._length(step + 1)  # finished among the best K: length-normalised hypotheses
        new = ends & self.among_best[None]
        scores = scores + (~self.improvable).float() * -1e9 + (~new).float() * -1e9
        merged_scores = torch.cat([self.finished_scores, scores], dim=1)
        best = torch.topk(merged_scores, k).indices
        self.finished = torch.take_along_dim(torch.cat([self.finished, candidates], dim=1), best[:, :, None], dim=1)
        self.is_finished = torch.take_along_dim(torch.cat([self.is_finished, new], dim=1), best, dim=1)
        self.finished_scores = torch.take_along_dim(merged_scores, best, dim=1)
        best_possible = self.running_scores[:, :1] / self._length(step + 1)  # can a running beam still win?
        worst = torch.where(self.is_finished, self.finished_scores.min(dim=1, keepdim=True).values, -1e9)
        self.improvable = self.improvable & (best_possible > worst).any(dim=-1, keepdim=True)
        return bool(self.improvable.any()) and not bool((ends | done).all()) and step + 1 < self.max_new_tokens

    def best(self, stop: set[int]) -> list[list[int]]:
        """The best finished hypothesis of each question (tokens before a stop token)."""
        return [_cut_at_stop([t for t in row if t >= 0], stop) for row in self.finished[:, 0].tolist()]

    def decoded(self, stop: set[int], first: torch.Tensor) -> Decoded:
        """:meth:`best`, with the probability of each best hypothesis's first token in ``first`` ([questions,
        vocab]: the first step's distribution, which every beam of a question shares)."""
        firsts = self.finished[:, 0, 0].tolist()
        return Decoded(self.best(stop), _chosen_probability(first, range(self.batch), firsts))


def beam_search(first: torch.Tensor, stepper: Stepper, num_beams: int, max_new_tokens: int, stop: set[int],
                length_penalty: float = 1.0, processors: Processors = ()) -> Decoded:
    """Beam search with the semantics of transformers 5.x ``generate(num_beams=K, do_sample=False)``, its
    ``processors`` (:func:`adjusted`) applied to each step's log-probabilities as ``generate`` applies them.

    ``first``: [questions * K, vocab] (each question's rows repeated K times, question-major; the stepper
    holds the same rows); bookkeeping in :class:`BeamBook`. Stops when no running beam can beat the worst
    finished one (``early_stopping=False`` heuristic) or every continuation has stopped. Returns the best
    finished hypothesis of each question.
    """
    k = num_beams
    book = BeamBook(first.shape[0] // k, k, max_new_tokens, stop, length_penalty, device=first.device)
    held = torch.arange(book.batch)  # the questions whose beams the stepper holds, in its order
    logits = first
    for step in range(max_new_tokens):
        logits = book.spread(logits, held)  # done questions' rows get zeros: nothing of theirs changes (step)
        scores = adjusted(processors, book.answers(step), torch.log_softmax(logits.float(), dim=-1))
        if not book.step(scores, step):
            break
        going = held[book.improvable[held.to(book.improvable.device), 0].cpu()]
        if len(going) == book.batch:
            stepper.reorder(book.rows)
            logits = stepper.advance(book.tokens)
            continue
        # questions that can no longer improve leave the stepper: their beams are not fed again
        targets, rows = book.continuing(held, going)
        stepper.reorder(rows.to(book.rows.device))
        held = going
        logits = stepper.advance(book.tokens[targets.to(book.tokens.device)])
    # the first distribution on its device: only the best hypotheses' probabilities come back
    return book.decoded(stop, torch.softmax(first[::num_beams].float(), dim=-1))


# ---- OPERA (Huang et al. 2024; docs/variants.md, "How the engine decodes") -----------------------------------------
class AttentionStepper(Stepper, Protocol):
    """A stepper that also reports last-layer attention (max over heads, unnormalised) of the fed token:
    ``attention`` after :meth:`advance` ([rows, keys]); :meth:`probe` feeds each candidate alone and undoes it."""

    attention: torch.Tensor
    #: The column of the attention rows where the decoded tokens' keys start (None: it differs by row).
    prompt_columns: int | None

    def probe(self, candidates: torch.Tensor) -> torch.Tensor:
        """[rows, C] candidate tokens -> [rows, C, keys + 1] their attention rows; the cache is left as it was."""


def column_scores(window: torch.Tensor, scale_factor: float, float16: bool) -> torch.Tensor:
    """OPERA's over-trust score of each column j of a lower-triangular local window [..., n, n]:
    1e-7 * prod over rows i >= j (diagonal included) of scale_factor * a[i, j].

    ``float16``: stored in half precision as the official code does (long products overflow to inf).
    """
    n = window.shape[-1]
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
    scaled = torch.where(lower, window.double() * scale_factor, torch.ones_like(window, dtype=torch.float64))
    scores = 1e-7 * scaled.prod(dim=-2)
    return scores.half() if float16 else scores.float()


def _opera_candidates(raw: torch.Tensor, stepper: AttentionStepper, settings, history: torch.Tensor, step: int,
                      image_span: tuple[int, int], prompt_columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One OPERA step over the vocabulary's top candidates: the step's logits (-999 outside the candidates) and
    each row's over-trust column. ``prompt_columns``: where the generated tokens' keys start."""
    count = min(settings.num_attn_candidates, raw.shape[-1])
    candidate_logits, candidates = raw.topk(count, dim=-1)
    rows = stepper.probe(candidates).float().cpu()
    rows = rows / rows.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    image_reward = rows[..., image_span[0] : image_span[1] + 1].sum(dim=-1)
    window = torch.zeros(raw.shape[0], count, step + 1, step + 1)
    window[:, :, :step, :step] = history[:, None]
    window[:, :, step, :] = rows[..., prompt_columns : prompt_columns + step + 1]
    over_trust, columns = column_scores(window, settings.scale_factor, settings.float16_scores).float().max(-1)
    penalty = -image_reward if step + 1 <= settings.reward_tokens else over_trust
    scored = candidate_logits - settings.penalty_weights * penalty
    return torch.full_like(raw, -999.0).scatter(-1, candidates, scored), columns.mode(dim=-1).values


def _opera_advance(stepper: AttentionStepper, rows: torch.Tensor, tokens: torch.Tensor, history: torch.Tensor,
                   step: int, prompt_columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed the beams' chosen ``tokens``, beam i continuing from the stepper's row ``rows[i]`` (``history``: each
    of the stepper's rows' attention so far): the next logits and the history of the beams fed, grown by their
    attention rows."""
    stepper.reorder(rows)
    history = history[rows]
    logits = stepper.advance(tokens)
    row = stepper.attention.float().cpu()
    row = row / row.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    grown = torch.zeros(history.shape[0], step + 1, step + 1)
    grown[:, :step, :step] = history
    grown[:, step, :] = row[:, prompt_columns : prompt_columns + step + 1]
    return logits, grown


def opera_search(first: torch.Tensor, stepper: AttentionStepper, settings, num_beams: int, max_new_tokens: int,
                 stop: set[int], image_span: tuple[int, int], prompt_length: int, reopen,
                 length_penalty: float = 1.0, normalised_length: int | None = None, processors: Processors = ()
                 ) -> tuple[Decoded, list[tuple[int, int]]]:
    """OPERA's beam search for ONE question (``first``: its K rows): (its best tokens as one :class:`Decoded` row,
    rollbacks as (step, position)). The first token's probability is the first step's: the softmax over its
    penalised candidates (retrospection never returns to the first step).

    Per step, per beam: the top ``num_attn_candidates`` tokens of the raw logits; each is fed alone to read
    its last-layer attention row (max over heads, renormalised over all keys). Within the first
    ``reward_tokens`` tokens a candidate gains its attention on the image tokens (``image_span``, inclusive);
    later it loses the over-trust score of the local window (the generated tokens and the candidate):
    max over columns of 1e-7 * prod (scale_factor * a), times ``penalty_weights``. The step's distribution
    is log-softmax over the candidates only (-999 elsewhere), and :class:`BeamBook` ranks the beams (length
    normalised by prompt + generated length when ``full_length_normalisation``, as the official code; the prompt
    counts ``normalised_length`` tokens when given: the official LLaVA wrapper's prompt holds the image as one
    placeholder, not its expanded image tokens).

    Retrospection: each beam's over-trust column (the mode over its candidates) is recorded per step; when
    the columns' mode (over beams), at column >= 10, has recurred more than ``threshold`` times for every
    beam, decoding returns to the state before the token after that column (one earlier if that position
    was already revisited ``num_attn_candidates`` times; none if both were) and retakes that step over the
    whole vocabulary, without the (beam, token) choices made there before. ``reopen()`` gives a fresh
    stepper at the prompt (its rows are then fed the restored beams' tokens).
    """
    k = num_beams
    offset = (prompt_length if normalised_length is None else normalised_length) \
        if settings.full_length_normalisation else 0
    book = BeamBook(1, k, max_new_tokens, stop, length_penalty, length_offset=offset)
    history = torch.zeros(k, 0, 0)  # renormalised attention of generated rows on generated columns
    locs: list[torch.Tensor] = []  # per step: each beam's over-trust column
    revisits: dict[int, int] = {}
    chosen: dict[int, list[tuple[int, int]]] = {}
    banned: dict[int, list[tuple[int, int]]] = {}
    snapshots: dict[int, tuple] = {}
    rollbacks: list[tuple[int, int]] = []
    logits, step, retake = first, 0, False
    while True:
        snapshots[step] = (copy.deepcopy(book), history.clone(), logits.clone(), list(locs))
        raw = logits.float().cpu()
        if retake:  # the revisited step: the whole vocabulary, earlier choices there banned
            step_logits = raw - raw.min(dim=-1, keepdim=True).values - 999.0
            for row, token in banned[step]:
                step_logits[row, token] = -999.0
        else:
            step_logits, beam_columns = _opera_candidates(raw, stepper, settings, history, step, image_span,
                                                          prompt_length)
            if step == 0:
                first_step = torch.softmax(step_logits[:1], dim=-1)
            locs.append(beam_columns)
            target = _rollback_target(beam_columns, locs, settings, revisits, step)
            if target is not None:
                rollbacks.append((step, target))
                revisits[target] = revisits.get(target, 0) + 1
                banned.setdefault(target, []).extend(chosen.get(target, []))
                saved_book, history, logits, locs = snapshots[target]
                book, locs = copy.deepcopy(saved_book), list(locs)
                stepper = reopen()
                for position in range(target):
                    stepper.advance(book.running[0, :, position])
                step, retake = target, True
                continue
        more = book.step(adjusted(processors, book.answers(step), torch.log_softmax(step_logits, dim=-1)), step)
        chosen[step] = list(zip(book.rows.tolist(), book.tokens.tolist()))
        retake = False
        if not more:
            break
        logits, history = _opera_advance(stepper, book.rows, book.tokens, history, step, prompt_length)
        step += 1
    return book.decoded(stop, first_step), rollbacks


def opera_batch(first: torch.Tensor, stepper: AttentionStepper, settings, num_beams: int, max_new_tokens: int,
                stop: set[int], image_span: tuple[int, int], prompt_columns: int, prompt_lengths: list[int],
                length_penalty: float = 1.0, processors: Processors = ()) -> list[Decoded | None]:
    """OPERA for several questions at once (``first``: K rows per question, question-major), each decoded as
    :func:`opera_search` decodes it alone (one :class:`Decoded` row each), up to its retrospection: a question
    whose retrospection would roll back gets None (decode it alone; rollbacks need 10+ generated tokens, so they
    are rare).

    The rows may be left-padded prompts: ``prompt_columns`` is where the generated tokens' keys start in every
    row, ``prompt_lengths`` each question's prompt length for the length normalisation (as
    :func:`opera_search`'s ``normalised_length``). A question stops
    when its :func:`opera_search` loop would (no beam can improve, or every continuation ended); its best
    hypothesis is taken then, and its beams leave the stepper (:meth:`Stepper.reorder` to the other questions'
    beams), as do those of a question left to :func:`opera_search`: later steps probe and feed only the
    questions still answering (a trained model's YN answer ends after a token or two). The book keeps every
    question (as :func:`beam_search`'s: those that left get neutral rows, and their results are already taken).
    """
    k, questions = num_beams, first.shape[0] // num_beams
    offsets = torch.tensor(prompt_lengths if settings.full_length_normalisation else [0] * questions,
                           dtype=torch.float64)[:, None]
    book = BeamBook(questions, k, max_new_tokens, stop, length_penalty, length_offset=offsets)
    held = torch.arange(questions)  # the questions whose beams the stepper holds, in its order
    history = torch.zeros(questions * k, 0, 0)  # per row of the stepper (held's beams)
    locs: list[torch.Tensor] = []  # per step: each beam's over-trust column, by book row (-1: not held then)
    results: list[Decoded | None] = [None] * questions
    active = torch.ones(questions, dtype=torch.bool)
    logits, step = first, 0
    while True:
        step_logits, beam_columns = _opera_candidates(logits.float().cpu(), stepper, settings, history, step,
                                                      image_span, prompt_columns)
        if step == 0:
            first_step = torch.softmax(step_logits[::k], dim=-1)
        step_logits = book.spread(step_logits, held)  # the questions that left get neutral rows
        locs.append(book.spread(beam_columns, held, fill=-1))
        # retrospection (leave that question to opera_search) needs an over-trust column >= 10: none before step 10
        for q in torch.nonzero(active).flatten().tolist() if step >= ROLLBACK_COLUMN else []:
            own = [columns[q * k : (q + 1) * k] for columns in locs]
            if _rollback_target(own[-1], own, settings, {}, step) is not None:
                active[q] = False
        book.step(adjusted(processors, book.answers(step), torch.log_softmax(step_logits, dim=-1)), step)
        done = active & ~(book.improvable[:, 0] & ~book.ends.all(dim=-1) & (step + 1 < max_new_tokens))
        best = book.decoded(stop, first_step) if bool(done.any()) else None
        for q in torch.nonzero(done).flatten().tolist():
            results[q] = Decoded([best.tokens[q]], [best.first_probability[q]])
        active &= ~done
        if not bool(active.any()):
            return results
        # the questions still answering keep their beams (each from a row of its own question); the rest leave
        going = torch.nonzero(active).flatten()
        targets, rows = book.continuing(held, going)
        logits, history = _opera_advance(stepper, rows, book.tokens[targets], history, step, prompt_columns)
        held = going
        step += 1


#: The first over-trust column retrospection returns to (the official code's ``loc >= 10``); a column of step s's
#: window is at most s.
ROLLBACK_COLUMN = 10


def _rollback_target(beam_columns: torch.Tensor, locs: list[torch.Tensor], settings, revisits: dict[int, int],
                     step: int) -> int | None:
    """The position OPERA's retrospection returns to, or None (see :func:`opera_search`)."""
    column = int(beam_columns.mode().values)
    if column < ROLLBACK_COLUMN:
        return None
    seen = torch.stack(locs).eq(column).sum(dim=0)  # per beam: steps whose over-trust column was this one
    if not bool((seen > settings.threshold).all()):
        return None
    for target in (column + 1, column):
        if revisits.get(target, 0) < settings.num_attn_candidates and 0 < target <= step:
            return target
    return None
