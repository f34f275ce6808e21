"""Hugging Face transformers vision-language backends and their scoring engine.

Scoring reads the logits of the first answer position (no generation):
P(yes) = softmax mass of the "yes" spellings over yes+no spellings, and
``yes_margin`` = logsumexp of their logits minus that of the "no" logits (float64,
so it still ranks answers where P(yes) rounds to 1.0); MC = mass
of each option letter's tokens, renormalised; ``confidence`` = the max softmax
probability over the whole vocabulary there (paper Eq. 2); the raw answer is
the decoded argmax token.

Speed comes from two things, neither of which changes a number:

- **Prefix reuse.** Questions on one image share a token prefix (chat header
  and the image tokens, cut right after the last image token). It is run once,
  with the vision tower, and its key/value cache is reused for every question
  on that image (YN and MC, every question set, MC rotations included); only
  the suffixes run per question. :meth:`LogitsVLM.score_mixed` scores YN and MC
  questions of an image in one pass.
- **Length-bucketed batches.** Suffixes (or, without reuse, whole prompts) are
  sorted by length and right-padded; each row's logits are read at its own
  last token, so padding never moves a position.

Architectures whose image encoder reads the question (InstructBLIP's
Q-Former) cannot reuse a prefix and take the batched full-forward path.
Results equal an unbatched full forward pass (tested to 1e-4 on every tiny
model).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import logging
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from verbmirage.models.base import (
    UNKNOWN,
    YES,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    allow_remote_code,
    open_rgb,
)
from verbmirage.core.imaging import expand_to_square, square_input_side
from verbmirage.models import shared_prefix
from verbmirage.variants import search as decoding
from verbmirage.models.parsing import decide_choice, decide_yes_no, letter_token, yes_no_token
from verbmirage.models.prompts import CHAT_TEMPLATE, CONVERSATIONS, PromptTemplate
from verbmirage.models.registry import IMAGE_MODES
from verbmirage.variants.settings import ALL_FEATURES, question_seed
from verbmirage.models.adapters import attach_adapter

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_OPTIONS = 26


def images_only_processor(processor_class):
    """``processor_class`` without its video processor.

    Qwen-VL processors build a video processor that needs torchvision; for
    image questions it is never used, so where torchvision is missing (CPU
    test machines) the processor is assembled without it.
    """

    class ImagesOnly(processor_class):
        @classmethod
        def get_attributes(cls):
            return [name for name in processor_class.get_attributes() if name != "video_processor"]

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor_class.__name__
    return ImagesOnly


#: A whole token that answers yes or no: optional space, the word, at most one closing punctuation mark.


def _decode_or_none(tokenizer, token_id: int) -> str | None:
    """``tokenizer.decode([token_id])``, or None where that raises (Qwen's lone ``<img>``, ids past its table)."""
    try:
        return tokenizer.decode([token_id])
    except Exception:  # noqa: BLE001 - checkpoint tokenizers raise ValueError, KeyError, ...
        return None


def answer_token_ids(vocabulary, where: str) -> tuple[list[int], list[int], list[list[int]]]:
    """Ids of the tokens that spell yes, no and each option letter, from the decoded vocabulary.

    ``vocabulary[i]`` is the text of token ``i``, or None where it cannot be
    decoded (skipped). A token counts only as a whole word: ``" Yes"``,
    ``"no."``, but not ``"ności"`` or ``"Yesterday"`` (S4).
    """
    yes, no, letters = [], [], [[] for _ in range(MAX_OPTIONS)]
    for token_id, text in enumerate(vocabulary):
        if not text or not text.strip():
            continue
        word = yes_no_token(text)
        if word is not None:
            (yes if word == YES else no).append(token_id)
        letter = letter_token(text, MAX_OPTIONS)
        if letter is not None and text.strip() == letter:
            letters[ord(letter) - ord("A")].append(token_id)
    if not yes or not no:
        raise ValueError(f"{where}: the tokenizer has no token for 'yes' or 'no'")
    return yes, no, letters


def decoder_layers(model) -> list:
    """The language model's decoder layers (each with ``self_attn``): OPERA and the attention analysis read
    their attention."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no language-model decoder layers found")
    return list(layers)


def use_eager_language_model(model) -> None:
    """Eager attention in the language model only (its weights are returned); the vision tower keeps its
    implementation."""
    config = model.config
    if "text_config" in getattr(config, "sub_configs", {}):
        model.set_attn_implementation({"text_config": "eager"})
    else:
        model.set_attn_implementation("eager")


def _is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def _probabilities(probs: torch.Tensor, tokens: list[int]) -> list[float]:
    """P(token) of each row over the real tokens; 0 for an id of the output layer's padding (never a real
    answer). One gather for all rows: a thousand-row call spent more on per-row indexing than on its forwards."""
    real = torch.tensor([token if token < probs.shape[1] else 0 for token in tokens], dtype=torch.long)
    chosen = probs[torch.arange(len(tokens)), real].tolist()
    return [value if token < probs.shape[1] else 0.0 for value, token in zip(chosen, tokens)]


class LogitsVLM(VisionLanguageModel):
    """Scores from the logits at the first answer position; subclasses provide :meth:`answer_logits`.

    Needs ``self.tokenizer`` and a call of :meth:`_find_answer_tokens` once it exists.
    """

    #: New tokens decoded greedily when the first answer token decides nothing (``inference.continue_tokens``).
    continue_tokens: int = 8

    def answer_logits(self, questions: list[Question], multiple_choice: bool) -> tuple:
        """Float32 logits [N, vocab] at each question's first answer position, per-question errors and,
        optionally, per-question extra result fields (a list of dicts, one per question: VCD's statistics),
        each in the order of ``questions``."""
        raise NotImplementedError

    def _find_answer_tokens(self) -> None:
        self._yes_ids, self._no_ids, self._letter_ids = self._answer_token_ids()

    def _answer_token_ids(self):
        """Ids of every vocabulary token that spells yes / no / an option letter (see :func:`answer_token_ids`)."""
        yes, no, letters = answer_token_ids(self._vocabulary(), f"models.{self.name}")
        to_tensor = lambda ids: torch.tensor(ids, dtype=torch.long)
        return to_tensor(yes), to_tensor(no), [to_tensor(ids) for ids in letters]

    def _vocabulary(self) -> list[str | None]:
        """Decoded text of each token id; None where the tokenizer cannot decode an id alone."""
        return [_decode_or_none(self.tokenizer, i) for i in range(len(self.tokenizer))]

    def _real_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits of real tokens only: output layers padded past the tokenizer (Qwen: 151936 rows for
        151860 tokens) would otherwise take probability mass and could win the argmax (S5)."""
        return logits[:, : len(self.tokenizer)]

    def _token_text(self, token_id: int) -> str:
        return _decode_or_none(self.tokenizer, token_id) or ""

    # ---- decoding past the first token ---------------------------------------------
    def continue_answers(self, questions: list[Question], multiple_choice: bool) -> list[str] | None:
        """The greedy answer text of each question, first token included (``continue_tokens`` new tokens).

        Asked only for answers whose first token decides nothing (neither yes/no nor an
        option letter). None: this backend cannot decode further, so those answers are unknown.
        """
        return None

    def _continued(self, questions: list[Question], rows: list[int], multiple_choice: bool) -> dict[int, str]:
        if not rows or self.continue_tokens <= 0:
            return {}
        texts = self.continue_answers([questions[i] for i in rows], multiple_choice)
        return {} if texts is None else dict(zip(rows, texts))

    def decode_answers(self, questions: list[Question], multiple_choice: bool) -> list[tuple[int | None, str]]:
        """The variant's decoded answer of each question: (first token id or None, text). Backends that run
        beam search, sampling or VCD implement it (:class:`TransformersVLM`)."""
        raise NotImplementedError(f"backend '{self.backend}' decodes greedily only")

    def _stop_tokens(self) -> set[int]:
        """Token ids that end an answer (the tokenizer's end of sequence; the transformers backends add the
        generation config's)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return {eos} if eos is not None else set()

    def _decisions(self, questions: list[Question], errors: list, best: torch.Tensor, multiple_choice: bool,
                   decided) -> tuple[list[int | None], dict[int, str]]:
        """The first answer token of each question (None: the answer ended at once) and, where needed, its
        decoded text.

        Plain greedy: the first-position argmax, and a greedy continuation only where that token decides
        nothing (``decided``). Greedy with VCD: the same, continued by VCD's greedy steps. Beam search and
        sampling: every answer decoded in full (its first token need not be the argmax). An answer whose
        first token ends it (end of sequence) is empty, whatever the decoding: it decides nothing.
        """
        stop = self._stop_tokens()
        first_ids: list[int | None] = [None if int(token) in stop else int(token) for token in best]
        if self.variant.decoding == "greedy":
            undecided = [i for i, error in enumerate(errors) if error is None and first_ids[i] is not None
                         and not decided(i, self._token_text(first_ids[i]))]
            if self.variant.vcd is None:
                return first_ids, self._continued(questions, undecided, multiple_choice)
            rows = undecided if self.continue_tokens > 0 else []
        else:
            rows = [i for i, error in enumerate(errors) if error is None]
        if not rows:
            return first_ids, {}
        decoded = self.decode_answers([questions[i] for i in rows], multiple_choice)
        for i, (token, _) in zip(rows, decoded):
            first_ids[i] = token  # None: the decoding ended at once (its rows stop before the end token)
        return first_ids, {i: text for i, (_, text) in zip(rows, decoded)}

    def _answer_texts(self, first_ids: list[int | None], continued: dict[int, str]) -> list[tuple[str, str | None]]:
        """Per question, (its first token's text, its decoded text or None) for the parsers; an answer that
        ended at once is ("", ""), which parses as ``unknown`` by the rule ``empty``."""
        return [("", "") if token is None else (self._token_text(token), continued.get(i))
                for i, token in enumerate(first_ids)]

    def _confidences(self, probs: torch.Tensor, first_ids: list[int | None]) -> list[float]:
        """The probability of each answer's first token (paper Eq. 2); for an answer that ended at once, that of
        the most probable end token (the token it ended with)."""
        stop = sorted(token for token in self._stop_tokens() if token < probs.shape[1])
        ending = probs[:, stop].max(dim=-1).values.tolist() if stop else [math.nan] * len(first_ids)
        chosen = _probabilities(probs, [0 if token is None else token for token in first_ids])
        return [ending[i] if token is None else chosen[i] for i, token in enumerate(first_ids)]

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
        logits, errors, columns = self._logits(questions, [bool(flag) for flag in multiple_choice])
        results: list = [None] * len(questions)
        for flag, indices in kinds.items():
            if not indices:
                continue
            decide = self._multiple_choice_results if flag else self._yes_no_results
            chosen = decide([questions[i] for i in indices], logits[indices], [errors[i] for i in indices],
                            [columns[i] for i in indices])
            for i, result in zip(indices, chosen):
                results[i] = result
        self._check_results(questions, results)
        return results

    def _logits(self, questions: list[Question], multiple_choice) -> tuple[torch.Tensor, list, list[dict]]:
        """:meth:`answer_logits`, with its per-question columns (``[{}] * n`` where it returns none)."""
        answer = self.answer_logits(questions, multiple_choice)
        logits, errors = answer[0], answer[1]
        return logits, errors, answer[2] if len(answer) > 2 else [{}] * len(questions)

    def _score_yes_no(self, questions: list[Question]) -> list[YesNoResult]:
        """Score (P(yes), ``yes_margin``) from the first answer position; decision from the decoded answer."""
        return self._yes_no_results(questions, *self._logits(questions, multiple_choice=False))

    def _yes_no_results(self, questions: list[Question], logits: torch.Tensor, errors: list,
                        columns: list[dict]) -> list[YesNoResult]:
        """``columns``: each question's extra result fields from its logits pass (VCD's statistics)."""
        probs = torch.softmax(self._real_tokens(logits), dim=-1)
        yes, no = probs[:, self._yes_ids].sum(-1), probs[:, self._no_ids].sum(-1)
        # float64, from the logits themselves: finite where the float32 P(yes) above is exactly 1.0
        real = self._real_tokens(logits).double()
        yes_log_mass = torch.logsumexp(real[:, self._yes_ids], -1)
        margins = yes_log_mass - torch.logsumexp(real[:, self._no_ids], -1)
        # the yes mass over the vocabulary, float64 too: in float32 a confident model's rows all tie at 1.0
        masses = (yes_log_mass - torch.logsumexp(real, -1)).exp().tolist()
        first_ids, continued = self._decisions(questions, errors, probs.argmax(dim=-1), False,
                                               lambda i, text: yes_no_token(text) is not None)
        texts = self._answer_texts(first_ids, continued)
        p_yes, margins, confidences = (yes / (yes + no)).tolist(), margins.tolist(), self._confidences(probs, first_ids)
        results = []
        for i, error in enumerate(errors):
            if error is not None:
                results.append(YesNoResult.failed(error))
                continue
            prediction, raw, rule = decide_yes_no(*texts[i], self.variant.label)
            margin = margins[i] if math.isfinite(margins[i]) else None
            results.append(YesNoResult(p_yes[i], prediction, raw, confidences[i], rule, yes_margin=margin,
                                       yes_mass=masses[i], **columns[i]))
        return results

    def _score_multiple_choice(self, questions: list[Question]) -> list[MultipleChoiceResult]:
        """Option probabilities from the first answer position; the chosen letter from the decoded answer."""
        return self._multiple_choice_results(questions, *self._logits(questions, multiple_choice=True))

    def _multiple_choice_results(self, questions: list[Question], logits: torch.Tensor, errors: list,
                                 columns: list[dict]) -> list[MultipleChoiceResult]:
        probs = torch.softmax(self._real_tokens(logits), dim=-1)
        first_ids, continued = self._decisions(
            questions, errors, probs.argmax(dim=-1), True,
            lambda i, text: decide_choice(text, None, questions[i].options)[0] != UNKNOWN)
        texts = self._answer_texts(first_ids, continued)
        letters = max((len(question.options) for question in questions), default=0)
        masses = torch.stack([probs[:, ids].sum(-1) for ids in self._letter_ids[:letters]], dim=1).tolist() \
            if letters else [[]] * len(questions)
        confidences = self._confidences(probs, first_ids)
        results = []
        for i, (question, error) in enumerate(zip(questions, errors)):
            n = len(question.options)
            if error is not None:
                results.append(MultipleChoiceResult.failed(n, error))
                continue
            mass = np.array(masses[i][:n])
            option_probs = tuple(float(x) for x in mass / mass.sum()) if mass.sum() > 0 else (math.nan,) * n
            letter, raw, rule = decide_choice(*texts[i], question.options, self.variant.label)
            results.append(MultipleChoiceResult(option_probs, letter, raw, confidences[i], rule, **columns[i]))
        return results


def _concatenated(parts: list[list]) -> list:
    return [row for part in parts for row in part]


@dataclasses.dataclass
class _Prefix:
    """One image's prefix in the model: per layer (keys, values) with batch 1, and what else its family needs."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    extra: object = None


def _cheapest_cuts(lengths: list[int], batch_cost: int, max_rows: int | None = None) -> list[int]:
    """Where to cut rows sorted by length (ascending) into batches so that the token positions computed, each
    batch's rows times its longest row plus ``batch_cost`` per batch (its fixed cost, in positions), are
    fewest, no batch holding more than ``max_rows`` rows. Dynamic programming over the cut points, one numpy
    step per row (no library partitions a sorted sequence by this cost)."""
    n = len(lengths)
    if n < 2:
        return []
    longest = np.asarray(lengths, dtype=np.int64)
    best = np.zeros(n + 1, dtype=np.int64)  # best[j]: the cheapest cost of rows[:j]
    start_of = np.zeros(n + 1, dtype=np.int64)  # where the last batch of that cheapest rows[:j] starts
    for stop in range(1, n + 1):
        first = 0 if max_rows is None else max(0, stop - max_rows)
        starts = np.arange(first, stop)
        costs = best[first:stop] + (stop - starts) * longest[stop - 1] + batch_cost
        start_of[stop] = first + int(np.argmin(costs))
        best[stop] = costs[start_of[stop] - first]
    cuts, stop = [], n
    while stop > 0:
        stop = int(start_of[stop])
        cuts.append(stop)
    return sorted(cuts)[1:]  # without 0


class _Rows:
    """The tokenized prompts of one engine call: per row its cached prefix (the image, or the image
    and a text header the row shares with others: :meth:`TransformersVLM._text_headers`), prefix length and
    suffix (None: no shared prefix, then its whole token length), and those prefixes."""

    def __init__(self, n: int):
        self.prefix_key: list = [None] * n
        self.prefix_length = [0] * n
        self.suffix: list[torch.Tensor | None] = [None] * n
        self.length = [0] * n
        self.on_prefix: list[int] = []
        self.fallback: list[int] = []
        self.prefixes: dict[tuple, _Prefix] = {}

    def add(self, row: int, prefix_key: tuple, prefix_length: int, suffix: torch.Tensor) -> None:
        self.prefix_key[row], self.prefix_length[row], self.suffix[row] = prefix_key, prefix_length, suffix
        self.on_prefix.append(row)

    def batches(self, batch_cost: int, cross_images: bool, max_rows: int | None = None) -> list[list[int]]:
        """Rows on a prefix in suffix batches: one prefix (or, ``cross_images``, one prefix length) per batch,
        each group sorted by suffix length and cut where the padded work is least (:func:`_cheapest_cuts`),
        at most ``max_rows`` rows each."""
        groups: dict = {}
        for row in self.on_prefix:
            groups.setdefault(self.prefix_length[row] if cross_images else self.prefix_key[row], []).append(row)
        batches: list[list[int]] = []
        for rows in groups.values():
            rows = sorted(rows, key=lambda r: len(self.suffix[r]))
            cuts = _cheapest_cuts([len(self.suffix[r]) for r in rows], batch_cost, max_rows)
            batches += [rows[start:stop] for start, stop in zip([0] + cuts, cuts + [len(rows)])]
        return batches

    def prefixes_of(self, rows: list[int]) -> tuple[list[_Prefix], list[int]]:
        """The distinct prefixes of ``rows`` and the index of each row's prefix among them."""
        keys = list(dict.fromkeys(self.prefix_key[row] for row in rows))
        position = {key: j for j, key in enumerate(keys)}
        return [self.prefixes[key] for key in keys], [position[self.prefix_key[row]] for row in rows]


class TransformersVLM(LogitsVLM):
    """Any model that loads with ``AutoModelForImageTextToText`` + ``AutoProcessor`` and has a chat template."""

    backend = "hf"
    variant_features = ALL_FEATURES
    #: The transformers class that loads the checkpoint.
    model_class = "AutoModelForImageTextToText"
    #: Whether the image enters only through tokens before the question (so a shared prefix can be cached).
    supports_prefix_reuse = True
    #: Values the ``conversation`` setting may take (a key of ``prompts.CONVERSATIONS`` or the chat template).
    conversations: tuple[str, ...] = (CHAT_TEMPLATE,)

    def __init__(
        self,
        name: str,
        path: str,
        dtype: str = "float32",
        device: str = "cpu",
        prompts: dict | None = None,
        prefix_reuse: bool = True,
        trust_remote_code: bool = False,
        revision: str | None = None,
        attn_implementation: str | None = None,
        local_files_only: bool = False,
        conversation: str = CHAT_TEMPLATE,
        adapter: str | None = None,
        merge_adapter: bool = True,
        image_mode: str | None = None,
    ):
        super().__init__(name)
        modes = IMAGE_MODES.get(self.backend, IMAGE_MODES["hf"])
        if image_mode is not None and image_mode not in modes:
            raise ValueError(f"models.{name}.image_mode: '{image_mode}' is not one of {list(modes)} for backend "
                             f"'{self.backend}'")
        #: How images reach the processor (``registry.IMAGE_MODES``); the first mode is the processor as shipped.
        self.image_mode, self._shipped_mode = image_mode or modes[0], modes[0]
        if dtype not in DTYPES:
            raise ValueError(f"models.{name}.dtype: '{dtype}' is not one of {sorted(DTYPES)}")
        if conversation not in self.conversations:
            raise ValueError(f"models.{name}.conversation: '{conversation}' is not one of "
                             f"{list(self.conversations)} for backend '{self.backend}'")
        self.conversation = conversation
        self.device, self.dtype = torch.device(device), DTYPES[dtype]
        self.prompts = PromptTemplate.from_config(prompts, where=f"models.{name}.prompts")
        self.prefix_reuse = prefix_reuse and self.supports_prefix_reuse
        trust = allow_remote_code(f"models.{name}", trust_remote_code, revision, path)
        load = {"trust_remote_code": trust, "revision": revision, "local_files_only": local_files_only}
        self.processor = self._load_processor(path, load)
        self.model = self._load_model(path, load, attn_implementation)
        if adapter:  # a peft LoRA folder on top; refused unless every saved weight loads (models/adapters.py)

            self.model = attach_adapter(self.model, adapter, merge_adapter, where=f"models.{name}.adapter")
        self.model = self.model.to(self.device).eval()
        self.tokenizer = self.processor.tokenizer
        self._find_answer_tokens()
        # the kept image prefixes, oldest first: (image, prefix ids[, VCD noise]) -> _Prefix (_prefix_caches)
        self._prefixes: collections.OrderedDict[tuple, _Prefix] = collections.OrderedDict()
        # the images of the last call by path, and per image object (by id) its one-prompt processor encoding
        # and image tokens per placeholder (encode_shared_image)
        self._opened: dict[Path, Image.Image] = {}
        self._encoded_images: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self._kept_text_ids: dict[str, list[int]] = {}  # prompt text -> token ids (_text_ids)
        # transformers 5.2x renamed the cache argument `past_key_values` -> `cache`.
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    # ---- loading (override per family) ------------------------------------
    def _load_processor(self, path: str, load: dict):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path, **load)

    def _load_model(self, path: str, load: dict, attn_implementation: str | None):
        import transformers

        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model_class = getattr(transformers, self.model_class)
        return model_class.from_pretrained(path, dtype=self.dtype, **load, **extra)

    # ---- prompts ------------------------------------------------------------
    def render(self, question: Question, multiple_choice: bool | None) -> str:
        """The full prompt text, image placeholder included: the one rendering of scoring and generation.

        ``multiple_choice`` None is free text (``generate``): the question as it is, no answer instruction.
        """
        text = question.prompt if multiple_choice is None else self.prompts.render(question.prompt, multiple_choice)
        return self.render_turn(text)

    def render_turn(self, text: str) -> str:
        """One user turn (the image, then ``text``) and the opening of the answer, in the configured format."""
        if self.conversation != CHAT_TEMPLATE:
            return CONVERSATIONS[self.conversation].render(text, self.processor.image_token)
        frame = self._chat_frame()
        if frame is not None and text == text.strip():
            return frame[0] + text + frame[1]
        return self._chat_turn(text)

    def _chat_turn(self, text: str) -> str:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    #: Texts rendered to find the chat template's frame (sentence case, punctuation, a line break: as questions)
    FRAME_PROBES = ("Is someone probing the frame?\nAnswer yes or no.", "Which one? A. first\nB. second")

    def _chat_frame(self) -> tuple[str, str] | None:
        """The text the chat template puts before and after a turn's text, so that rendering a prompt is a
        concatenation (Jinja costs ~0.1 ms per prompt, twice per decoded question). Found from two probe texts;
        None, and every prompt goes through the template, when the template changes them or frames them
        differently. Texts with surrounding white space always go through it (templates often trim)."""
        if getattr(self, "_frame", False) is False:
            frames = set()
            for probe in self.FRAME_PROBES:
                rendered = self._chat_turn(probe)
                frames.add(tuple(rendered.split(probe)) if rendered.count(probe) == 1 else None)
            self._frame = frames.pop() if len(frames) == 1 else None
        return self._frame

    def encode(self, texts: list[str], images: list[Image.Image], padding_side: str = "right"):
        """Processor call (each image first as :meth:`prepare_image` makes it), padded on ``padding_side``, on the
        model's device."""
        self.tokenizer.padding_side = padding_side
        prepared: dict[int, Image.Image] = {}  # an image repeated for several prompts is prepared once
        images = [prepared.setdefault(id(image), self.prepare_image(image)) for image in images]
        encoded = self.processor(text=texts, images=images, return_tensors="pt", padding=True)
        return encoded.to(self.device)

    def prepare_image(self, image: Image.Image) -> Image.Image:
        """``image`` as the processor gets it under :attr:`image_mode`: as it is (the processor as shipped),
        expanded to a square in the processor's mean colour (``pad``: the original LLaVA-1.5's ``expand2square``
        with ``image_aspect_ratio: pad``), or squashed to the processor's square input size with bicubic
        resampling (``resize``: OPERA's LLaVA processor), after which the processor's own resize and crop
        change nothing."""
        if self.image_mode == self._shipped_mode:
            return image
        if self.image_mode == "pad":
            mean = self.processor.image_processor.image_mean
            return expand_to_square(image, tuple(int(value * 255) for value in mean))
        side = square_input_side(self.processor.image_processor)
        return image.resize((side, side), Image.BICUBIC)

    def encode_shared_image(self, texts: list[str], image: Image.Image) -> dict:
        """Like ``encode(texts, [image] * n)`` but the image is preprocessed once.

        The processor runs on the first prompt only, once per image object (kept for the next calls
        with the same image: scoring, decoding and VCD of an image all reuse it); the prompts are
        tokenized as text and their image placeholder is expanded to the same number of image tokens.
        If that does not reproduce the processor's tokens for the first prompt, this falls back to
        the processor for all rows.
        """
        image_token = self._image_token_id()
        if image_token is None:
            return self.encode(texts, [image] * len(texts))
        cached = self._encoded_images.get(id(image))
        if cached is None or cached[0] is not image:
            first = self.encode(texts[:1], [image])
            count = int((first["input_ids"][0] == image_token).sum())
            expanded, _ = self._expanded_rows(self._text_ids(texts[:1]), image_token, count)
            if expanded[0].tolist() != first["input_ids"][0, : int(first["attention_mask"][0].sum())].tolist():
                return self.encode(texts, [image] * len(texts))
            cached = self._encoded_images[id(image)] = (image, first, count)
            while len(self._encoded_images) > self.PREFIX_SLOTS:
                self._encoded_images.popitem(last=False)
        _, first, count = cached
        input_ids, attention_mask = self._expanded_rows(self._text_ids(texts), image_token, count)
        encoded = {"input_ids": input_ids.to(self.device), "attention_mask": attention_mask.to(self.device)}
        if "mm_token_type_ids" in first:  # per-token modality marks (1 = image token)
            encoded["mm_token_type_ids"] = (encoded["input_ids"] == image_token).long()
        return {**encoded, **self._image_inputs(first, len(texts))}

    #: At most this many prompt texts keep their token ids (:meth:`_text_ids`).
    TEXT_IDS_KEPT = 1 << 16

    def _text_ids(self, texts: list[str]) -> list[list[int]]:
        """The tokenizer's ids of each text, the new ones tokenized in one call and kept: prompts repeat across
        images (a YN question is asked of many), and one call per image cost ~1 ms each in the tokenizer."""
        kept = self._kept_text_ids
        new = list(dict.fromkeys(text for text in texts if text not in kept))
        if new:
            if len(kept) + len(new) > self.TEXT_IDS_KEPT:
                kept.clear()
            kept.update(zip(new, self.tokenizer(new)["input_ids"]))
        return [kept[text] for text in texts]

    def _expanded_rows(self, rows: list[list[int]], image_token: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, attention mask) of token id rows, right-padded, with each image placeholder repeated
        ``count`` times (the processor's expansion): written into one numpy array segment by segment (a tensor
        per ~600-token row cost more than the tokenizer)."""
        places = [[i for i, token in enumerate(ids) if token == image_token] for ids in rows]
        lengths = np.array([len(ids) + (count - 1) * len(found) for ids, found in zip(rows, places)])
        input_ids = np.full((len(rows), int(lengths.max())), self.tokenizer.pad_token_id or 0, dtype=np.int64)
        for r, (ids, found) in enumerate(zip(rows, places)):
            start = column = 0
            for place in found:  # the text before each placeholder, then its image tokens
                input_ids[r, column : column + place - start] = ids[start:place]
                column += place - start
                input_ids[r, column : column + count] = image_token
                column, start = column + count, place + 1
            input_ids[r, column : column + len(ids) - start] = ids[start:]
        attention_mask = np.arange(input_ids.shape[1])[None] < lengths[:, None]
        return torch.from_numpy(input_ids), torch.from_numpy(attention_mask.astype(np.int64))

    PER_TOKEN_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})

    def _image_inputs(self, first, rows: int) -> dict:
        """The image tensors of a one-row encoding, repeated for ``rows`` rows (batch-first layout)."""
        return {
            key: value.expand(rows, *value.shape[1:])
            for key, value in first.items()
            if key not in self.PER_TOKEN_KEYS and isinstance(value, torch.Tensor)
        }

    def _image_token_id(self) -> int | None:
        config = self.model.config
        return getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)

    open_image = staticmethod(open_rgb)

    # ---- the engine -----------------------------------------------------------
    mixed_kinds = True
    #: Whether the prefixes of several images can run as one batch and their questions share suffix batches
    #: (batch-first image tensors, one prefix length for every image: LLaVA). Otherwise each image alone.
    cross_image_batches: bool = False
    #: Whether the family's suffix batches may read their prefixes in place (:meth:`_reads_prefix_in_place`).
    shared_prefix_attention: bool = False
    #: At most this many image prefixes are kept (clean and VCD-noised count apart), and only those of the
    #: current call's images (for its decoding, and the next call if it continues an image).
    PREFIX_SLOTS = 32

    def forget_prefixes(self) -> None:
        """Drop the kept image prefixes and image encodings (benchmarks start cold; out of memory frees them)."""
        self._prefixes.clear()
        self._encoded_images.clear()
        self._opened = {}
        self._openings = None

    @torch.inference_mode()
    def answer_logits(self, questions: list[Question], multiple_choice) -> tuple[torch.Tensor, list, list[dict]]:
        """``multiple_choice``: one flag for all questions, or one per question (YN and MC of an image together).
        The third element holds each question's VCD statistics (``vcd_kl``, ``vcd_kl_reverse``, ``vcd_plausible``;
        VCD only)."""
        flags = multiple_choice if isinstance(multiple_choice, (list, tuple)) else [multiple_choice] * len(questions)
        texts = [self.render(q, flag) for q, flag in zip(questions, flags)]
        logits = torch.full((len(questions), self.model.config.get_text_config().vocab_size), math.nan)
        errors, items = self._open_items(questions, texts, new_call=True)
        # beam search, sampling and OPERA decode every question of the call next, greedy decoding (without VCD)
        # the questions whose first token decides nothing: they start from the scoring pass's rows
        variant = self.variant
        continues = variant.decoding == "greedy" and variant.vcd is None and self.continue_tokens > 0
        self._openings = {False: {}, True: {}} if self.prefix_reuse and (variant.decoding != "greedy" or continues) \
            else None
        self._multiple_choice_of = {(item[0], item[2]): flag for item, flag in zip(items, flags) if item is not None}
        kl = torch.full((len(questions),), math.nan, dtype=torch.float64)
        kl_reverse = kl.clone()
        plausible = torch.zeros(len(questions), dtype=torch.long)
        valid = [i for i, error in enumerate(errors) if error is None]
        if valid:
            method = self._prefix_logits if self.prefix_reuse else self._full_logits
            values = self._with_shrinking_batches(method, [items[i] for i in valid])
            if self.variant.vcd is not None:  # the same questions on the noised images, then VCD's contrast
                noised = self._with_shrinking_batches(functools.partial(method, noised=True), [items[i] for i in valid])
                contrasted = decoding.contrast(values, noised, self.variant.vcd)
                kl[valid], kl_reverse[valid], plausible[valid] = decoding.divergence(values, contrasted,
                                                                                     self.variant.vcd.beta)
                values = contrasted
            logits[valid] = values
        columns = [{"vcd_kl": float(kl[i]), "vcd_kl_reverse": float(kl_reverse[i]), "vcd_plausible": int(plausible[i])}
                   if self.variant.vcd is not None and math.isfinite(float(kl[i])) else {}
                   for i in range(len(questions))]
        return logits, errors, columns

    def _open_items(self, questions: list[Question], texts: list[str], new_call: bool = False) -> tuple[list, list]:
        """Per question: an error (its image does not open) or the item (image path, image, prompt text).

        ``new_call`` (scoring; decodings follow it on a subset of its questions): from now on only these
        images keep their prefix and encoding (a 7B model's prefix is ~0.3 GB).
        """
        images: dict[Path, Image.Image | str] = {}
        errors: list[str | None] = [None] * len(questions)
        items: list[tuple | None] = [None] * len(questions)
        for index, (question, text) in enumerate(zip(questions, texts)):
            if question.image not in images:
                images[question.image] = self._opened.get(question.image)
                if images[question.image] is None:
                    try:
                        images[question.image] = self.open_image(question.image)
                    except (OSError, ValueError) as error:
                        images[question.image] = f"image {question.image}: {type(error).__name__}: {error}"
            image = images[question.image]
            if isinstance(image, str):
                errors[index] = image
            else:
                items[index] = (question.image, image, text)
        opened = {path: image for path, image in images.items() if not isinstance(image, str)}
        if not new_call:  # the same image objects for the decodings of this call: encodings are kept by identity
            self._opened.update(opened)
            self._opened = dict(list(self._opened.items())[-self.PREFIX_SLOTS:])
            return errors, items
        self._opened = opened
        for key in [key for key in self._prefixes if key[0] not in self._opened]:
            del self._prefixes[key]
        kept = {id(image) for image in self._opened.values()}
        for key in [key for key in self._encoded_images if key not in kept]:
            del self._encoded_images[key]
        return errors, items

    def _with_shrinking_batches(self, method, items: list, size: int | None = None, combine=torch.cat):
        """Run ``method`` on chunks of ``items`` (at most ``size``; default all); on out-of-memory halve the
        chunk and retry. ``combine`` joins the chunks' results."""
        size, start, parts = max(1, size or len(items)), 0, []
        while start < len(items):
            chunk = items[start : start + size]
            try:
                parts.append(method(chunk))
                start += len(chunk)
            except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
                if not _is_out_of_memory(error) or size == 1:
                    raise
                size = max(1, size // 2)
                self.forget_prefixes()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                log.warning("%s: out of memory, batch halved to %d", self.name, size)
        return combine(parts)

    @staticmethod
    def _by_image(items: list[tuple]) -> dict[Path, list[int]]:
        groups: dict[Path, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item[0], []).append(index)
        return groups

    def _forward(self, **inputs) -> torch.Tensor:
        return self.model(**inputs, use_cache=False).logits

    def _full_logits(self, items: list[tuple], noised: bool = False) -> torch.Tensor:
        """Whole prompts, one right-padded batch per image; logits at each row's last real token."""
        result = None
        for indices in self._by_image(items).values():
            image_path, image, _ = items[indices[0]]
            encoded = self.encode_shared_image([items[i][2] for i in indices], image)
            if noised:
                encoded = self._noised_inputs(encoded, image_path)
            logits = self._forward(**encoded)
            last = encoded["attention_mask"].sum(dim=1) - 1
            values = logits[torch.arange(len(indices)), last].float().cpu()
            result = torch.empty(len(items), values.shape[1]) if result is None else result
            result[indices] = values
        return result

    def _prefix_logits(self, items: list[tuple], noised: bool = False) -> torch.Tensor:
        """Each image's prefix once (kept for the next call), then the suffixes in length-sorted batches.

        The prefix ends right after the image tokens: every prompt of an image (YN and MC, any question
        set, any batch) has that same prefix, so it is computed once per image however the questions are
        batched. Where images share one prefix length (:attr:`cross_image_batches`), their prefixes run as
        one batch and their questions share suffix batches, each row on its own image's prefix.
        """
        opened = self._open_rows(items, noised)
        result = None
        if opened.fallback:
            values = self._full_logits([items[i] for i in opened.fallback], noised)
            result = torch.empty(len(items), values.shape[1])
            result[opened.fallback] = values
        for batch in opened.batches(self.BATCH_COST, self.cross_image_batches, self.batch_rows):
            values = self._suffix_batch(opened, batch) if self._openings is None else \
                self._kept_opening(opened, batch, items, noised)
            result = torch.empty(len(items), values.shape[1]) if result is None else result
            result[batch] = values
        return result

    #: (scoring before a decoding) noised -> {(image path, prompt): (stepper, row)}: the decoding takes its rows
    #: from these steppers instead of running the prompts again; None when no decoding follows
    _openings: dict | None = None

    def _kept_opening(self, opened: _Rows, batch: list[int], items: list[tuple], noised: bool) -> torch.Tensor:
        """Scores a suffix batch as :meth:`_suffix_batch` does, as the opening of a decoding, and keeps it."""
        prefixes, image_of_row = opened.prefixes_of(batch)
        stepper = _PrefixStepper(self, self._rows_cache(prefixes, image_of_row), opened.prefix_length[batch[0]],
                                 [opened.suffix[i] for i in batch], prefixes[0].extra)
        values = stepper.first.cpu()
        rows = list(range(len(batch)))
        if self.variant.decoding == "greedy":  # continued: only rows whose first token cannot decide their kind
            tokens = self._real_tokens(values).argmax(dim=-1).tolist()
            kinds = [self._multiple_choice_of.get((items[i][0], items[i][2]), False) for i in batch]
            rows = [row for row, (token, kind) in enumerate(zip(tokens, kinds))
                    if token not in self._answer_tokens(kind)]
            stepper = stepper.subset(rows) if rows else None
        kept = self._openings[noised]
        for position, row in enumerate(rows):
            kept[items[batch[row]][0], items[batch[row]][2]] = (stepper, position)
        return values

    def _answer_tokens(self, multiple_choice: bool) -> frozenset[int]:
        """Token ids a first token can decide an answer with: the option letters (MC), yes and no (YN)."""
        if getattr(self, "_answer_token_sets", None) is None:
            ids = lambda groups: frozenset(int(i) for group in groups for i in group.tolist())  # noqa: E731
            self._answer_token_sets = {True: ids(self._letter_ids), False: ids((self._yes_ids, self._no_ids))}
        return self._answer_token_sets[multiple_choice]

    def _take_opening(self, items: list[tuple], noised: bool):
        """A stepper on ``items`` from the call's kept openings, or None: the rows of one scoring batch, or of
        several joined (:meth:`_PrefixStepper.joined`; not for OPERA, which needs one prompt width, nor where
        a prefix carries more than its keys and values, such as Qwen's rope delta)."""
        kept = (self._openings or {}).get(noised)
        found = [kept.get((path, text)) for path, _, text in items] if kept else [None]
        if any(entry is None for entry in found):
            return None
        steppers = {id(stepper): stepper for stepper, _ in found}
        if len(steppers) == 1:
            return found[0][0].subset([row for _, row in found])
        return _PrefixStepper.joined(found) if all(map(self._joins, steppers.values())) else None

    def _joins(self, stepper) -> bool:
        """Whether the rows of this kept opening may decode joined with those of others."""
        return self.variant.decoding != "opera" and stepper.extra is None

    #: The caller's batch size (:meth:`use_batch_size`); None: not given, a call is one batch.
    batch_size: int | None = None
    #: A greedy variant's scoring call holds this many batches' worth of questions (below).
    CALL_BATCHES = 4

    def _calls_span_batches(self) -> bool:
        return self.prefix_reuse and self.cross_image_batches and self.variant.decoding == "greedy"

    @property
    def batch_rows(self) -> int | None:
        """At most this many rows per forward (suffix batches, decodings) where a call holds several batches;
        None: the call is one batch."""
        return self.batch_size if self._calls_span_batches() else None

    def use_batch_size(self, batch_size: int) -> int:
        """Greedy variants on a model whose images share suffix batches (LLaVA): ``CALL_BATCHES`` batches' worth
        of questions per call, each forward still at most ``batch_size`` rows (:attr:`batch_rows`).

        A call's images run their prefixes as one batch and its suffixes are cut where padding costs least,
        so larger calls mean fuller forwards (bench/suite_scoring.py on the CPU: 64-question calls ~340
        prompts/s, 256 ~420). The memory that grows with the call is small on this path: the prefixes of its
        images (those of a 64-question call already number 2-3) and, for greedy continuation, the undecided
        rows' openings. Beam search, sampling and OPERA keep every scoring row as an opening for the decoding
        that follows, which grows with the call as a batch does, so they keep one batch per call.
        """
        self.batch_size = batch_size
        return batch_size * self.CALL_BATCHES if self._calls_span_batches() else batch_size

    #: A suffix batch's fixed cost in token positions: suffix batches are cut where padding costs more than one
    #: more forward (:func:`_cheapest_cuts`), so YN and MC prompts of an image (short and long suffixes) do not
    #: pad each other much. Measured on the CPU (bench/suite_scoring.py's model and the demo's tiny LLaVA),
    #: 256-2000 were as fast as or faster than 32; on a GPU a forward's launch overhead makes it larger still.
    BATCH_COST = 256

    def _open_rows(self, items: list[tuple], noised: bool) -> _Rows:
        """Tokenize ``items`` per image and find (computing what is missing) each image's prefix."""
        rows = _Rows(len(items))
        needed, headers = [], {}
        self._text_ids([text for *_, text in items])  # every new prompt of the call in one tokenizer call
        for indices in self._by_image(items).values():
            image_path, image, _ = items[indices[0]]
            encoded = self.encode_shared_image([items[i][2] for i in indices], image)
            prefix_length = self._shared_prefix_length(encoded)
            lengths = encoded["attention_mask"].sum(dim=1).tolist()
            if prefix_length == 0:  # the image is not inside a shared prefix
                rows.fallback += indices
                for r, i in enumerate(indices):
                    rows.length[i] = int(lengths[r])
                continue
            prefix_ids = encoded["input_ids"][0][:prefix_length]
            image_key = self._prefix_key(image_path, prefix_ids, noised)
            needed.append((image_path, prefix_ids, encoded))
            suffixes = [encoded["input_ids"][r, prefix_length : int(lengths[r])] for r in range(len(indices))]
            for r, header in enumerate(self._text_headers(suffixes)):
                key = image_key
                if header:
                    key = self._prefix_key(image_path, torch.cat([prefix_ids, suffixes[r][:header]]), noised)
                    headers.setdefault(key, (image_key, suffixes[r][:header]))
                rows.add(indices[r], key, prefix_length + header, suffixes[r][header:])
        rows.prefixes = self._prefix_caches(needed, noised)
        rows.prefixes.update(self._header_prefixes(headers, rows.prefixes))  # image prefix + shared text header
        return rows

    #: A text header (the first suffix tokens several prompts of an image share, e.g. an MC question before its
    #: options) becomes part of their cached prefix when it saves at least this many token positions.
    HEADER_SAVING = 32
    #: ... and is at least this long: shorter shared starts are not worth a forward of their own.
    HEADER_LENGTH = 4

    def _text_headers(self, suffixes: list[torch.Tensor]) -> list[int]:
        """Per suffix, how many of its first tokens it shares as a header with the others that start the same
        way (0: none), each keeping at least one token of its own.

        Prompts group by their first :attr:`HEADER_LENGTH` tokens; a group's header is its longest common
        start. One forward of the header on the image prefix then replaces running it once per prompt.
        """
        groups: dict[tuple, list[int]] = {}
        for r, suffix in enumerate(suffixes):
            if len(suffix) > self.HEADER_LENGTH:
                groups.setdefault(tuple(suffix[: self.HEADER_LENGTH].tolist()), []).append(r)
        headers = [0] * len(suffixes)
        for members in groups.values():
            if len(members) < 2:
                continue
            length = self._common_prefix_length([suffixes[r] for r in members])
            if length >= self.HEADER_LENGTH and (len(members) - 1) * length >= self.HEADER_SAVING:
                for r in members:
                    headers[r] = length
        return headers

    def _header_prefixes(self, headers: dict[tuple, tuple[tuple, torch.Tensor]],
                         image_prefixes: dict[tuple, _Prefix]) -> dict[tuple, _Prefix]:
        """The cached prefix of each image followed by a text header (``headers``: key -> (the image prefix's
        key, header tokens)), kept like image prefixes: one forward of each header on its image's prefix, the
        images with the same header and prefix length (:attr:`cross_image_batches`) in one batch."""
        found, groups = {}, {}
        for key, (image_key, header) in headers.items():
            found[key] = self._kept_prefix(key)
            if found[key] is None:
                image = image_prefixes[image_key]
                group = (tuple(header.tolist()), image.tensors[0][0].shape[-2]) if self.cross_image_batches else key
                groups.setdefault(group, []).append((key, image, header))
        for group in groups.values():
            images, header, rows = [image for _, image, _ in group], group[0][2], len(group)
            start = images[0].tensors[0][0].shape[-2]
            cache = self._cache_of([(torch.cat([image.tensors[layer][0] for image in images]),
                                     torch.cat([image.tensors[layer][1] for image in images]))
                                    for layer in range(len(images[0].tensors))])
            slots = torch.arange(start, start + len(header), device=self.device)
            mask = torch.ones((rows, start + len(header)), dtype=torch.long, device=self.device)
            self._suffix_forward(header[None].expand(rows, -1).to(self.device), mask, cache, slots,
                                 extra=images[0].extra, keep=1)
            computed = {key: _Prefix([(layer.keys[j : j + 1], layer.values[j : j + 1]) for layer in cache.layers],
                                     image.extra) for j, (key, image, _) in enumerate(group)}
            self._keep_prefixes(computed)
            found.update(computed)
        return found

    def _kept_prefix(self, key: tuple) -> _Prefix | None:
        """A kept prefix (now the most recently used), or None."""
        if key not in self._prefixes:
            return None
        self._prefixes.move_to_end(key)
        return self._prefixes[key]

    def _keep_prefixes(self, new: dict[tuple, _Prefix]) -> None:
        """Keep ``new`` prefixes, dropping the least recently used beyond :attr:`PREFIX_SLOTS`."""
        self._prefixes.update(new)
        while len(self._prefixes) > self.PREFIX_SLOTS:
            self._prefixes.popitem(last=False)

    def _prefix_key(self, image_path, prefix_ids: torch.Tensor, noised: bool) -> tuple:
        key = (image_path, tuple(prefix_ids.tolist()))
        return key + (self.variant.vcd, self.variant.seed) if noised else key

    def _prefix_caches(self, needed: list[tuple], noised: bool) -> dict[tuple, _Prefix]:
        """Key/value tensors of each image's prefix (``needed``: (image path, prefix ids, encoding)) by
        :meth:`_prefix_key`, computed once per image and kept (:attr:`PREFIX_SLOTS`); images with one prefix
        run as one batch.

        ``noised``: the prefix of VCD's noised image, kept apart from the clean one.
        """
        found, missing = {}, []
        for image_path, prefix_ids, encoded in needed:
            key = self._prefix_key(image_path, prefix_ids, noised)
            found[key] = self._kept_prefix(key)
            if found[key] is None:
                missing.append((key, image_path, prefix_ids, encoded))
        groups: dict[tuple, list[tuple]] = {}
        for entry in missing:  # one forward per group of images with the same prefix tokens
            group_key = entry[0][1] if self.cross_image_batches else entry[0]
            groups.setdefault(group_key, []).append(entry)
        for group in groups.values():
            inputs = [self._prefix_inputs(prefix_ids, self._noised_inputs(encoded, image_path) if noised else encoded)
                      for _, image_path, prefix_ids, encoded in group]
            batch = inputs[0] if len(inputs) == 1 else {key: torch.cat([one[key] for one in inputs])
                                                        for key in inputs[0]}
            output = self.model(**batch, use_cache=True, logits_to_keep=1)  # the prefix's logits are not used
            cache = output.get("cache") or output.get("past_key_values")
            extra = self._prefix_extra()
            computed = {key: _Prefix([(layer.keys[j : j + 1], layer.values[j : j + 1]) for layer in cache.layers],
                                     extra) for j, (key, *_) in enumerate(group)}
            found.update(computed)
            self._keep_prefixes(computed)
        return found

    def _prefix_extra(self):
        """What a family needs besides the key/value tensors to continue after its prefix (Qwen: rope delta)."""
        return None

    def _prefix_inputs(self, prefix_ids: torch.Tensor, encoded) -> dict:
        """Model inputs of the prefix pass: its tokens plus the image tensors of one row."""
        inputs = {"input_ids": prefix_ids[None], "attention_mask": torch.ones_like(prefix_ids)[None]}
        for key, value in encoded.items():
            if key not in self.PER_TOKEN_KEYS:
                inputs[key] = value[:1]
        return inputs

    def _common_prefix_length(self, ids: list[torch.Tensor]) -> int:
        shortest = min(len(row) for row in ids)
        stacked = torch.stack([row[:shortest] for row in ids])
        same = (stacked == stacked[0]).all(dim=0)
        mismatch = torch.nonzero(~same)
        length = int(mismatch[0]) if len(mismatch) else shortest
        return min(length, shortest - 1)  # every question keeps at least one token of its own

    def _last_image_token(self, ids: torch.Tensor) -> int:
        positions = torch.nonzero(ids == self._image_token_id())
        return int(positions[-1]) if len(positions) else -1

    def _shared_prefix_length(self, encoded) -> int:
        """Length of the image prefix every row of ``encoded`` starts with (0: none, or no prefix reuse)."""
        if not self.prefix_reuse:
            return 0
        lengths = encoded["attention_mask"].sum(dim=1).tolist()
        ids = [encoded["input_ids"][i, : int(n)] for i, n in enumerate(lengths)]
        prefix_length = self._last_image_token(ids[0]) + 1
        return prefix_length if prefix_length > 0 and self._common_prefix_length(ids) >= prefix_length else 0

    def _noised_inputs(self, encoded: dict, image_path) -> dict:
        """``encoded`` with VCD's diffusion noise on the pixel tensor, the same noise for every row of the image
        (seeded by the image's file name and the variant's seed)."""
        pixels = encoded["pixel_values"]
        rows = encoded["input_ids"].shape[0]
        per_image = pixels.shape[0] // rows
        seed = question_seed(Path(image_path).name, self.variant.seed)
        one = decoding.diffuse(pixels[:per_image], self.variant.vcd.noise_step, seed)
        return {**encoded, "pixel_values": one.repeat(rows, *[1] * (pixels.dim() - 1))}

    def _rows_cache(self, prefixes: list[_Prefix], image_of_row: list[int]):
        """A cache holding each row's image prefix (a view when every row has one image)."""
        rows = len(image_of_row)
        if len(prefixes) == 1:
            data = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefixes[0].tensors]
        else:
            index = torch.tensor(image_of_row, device=self.device)
            data = [(torch.cat([p.tensors[layer][0] for p in prefixes]).index_select(0, index),
                     torch.cat([p.tensors[layer][1] for p in prefixes]).index_select(0, index))
                    for layer in range(len(prefixes[0].tensors))]
        return self._cache_of(data)

    def _cache_of(self, data: list[tuple[torch.Tensor, torch.Tensor]]):
        """A transformers cache holding (keys, values) per layer."""
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=data, config=self.model.config)

    #: Language models whose attention layers go through transformers' attention interface, so that
    #: models/shared_prefix.py can stand in for it.
    SHARED_PREFIX_MODELS = ("llama", "mistral", "qwen2")

    def _reads_prefix_in_place(self) -> bool:
        """Whether suffix batches read their prefixes in place (models/shared_prefix.py) instead of one copy per
        row. Not with eager attention: the analyses that switch to it read its attention weights."""
        text = self.model.config.get_text_config()
        return self.shared_prefix_attention and text.model_type in self.SHARED_PREFIX_MODELS \
            and text._attn_implementation == "sdpa"

    def _suffix_batch(self, opened: _Rows, batch: list[int]) -> torch.Tensor:
        """Logits at the last token of each suffix of ``batch`` (right-padded, on its image's prefix)."""
        suffixes = [opened.suffix[i] for i in batch]
        prefix_length = opened.prefix_length[batch[0]]
        prefixes, image_of_row = opened.prefixes_of(batch)
        width = max(len(row) for row in suffixes)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long, device=self.device)
        for r, row in enumerate(suffixes):
            input_ids[r, : len(row)] = row
        slots = torch.arange(prefix_length, prefix_length + width, device=self.device)
        last = torch.tensor([[len(row) - 1] for row in suffixes], device=self.device)  # the only logits kept
        if self._reads_prefix_in_place():  # causal attention alone: a row's padding comes after its last token
            text = self.model.config.get_text_config()
            with shared_prefix.shared_prefix_attention(text, [p.tensors for p in prefixes], image_of_row):
                logits = self._suffix_forward(input_ids, None, shared_prefix.SuffixOnlyCache(config=text), slots,
                                              extra=prefixes[0].extra, keep=last)
        else:
            mask = torch.zeros((len(batch), prefix_length + width), dtype=torch.long, device=self.device)
            mask[:, :prefix_length] = 1
            for r, row in enumerate(suffixes):
                mask[r, prefix_length : prefix_length + len(row)] = 1
            logits = self._suffix_forward(input_ids, mask, self._rows_cache(prefixes, image_of_row), slots,
                                          extra=prefixes[0].extra, keep=last)
        return logits[:, 0].float().cpu()

    def _suffix_forward(self, input_ids, attention_mask, cache, slots, positions=None, extra=None,
                        keep: int | torch.Tensor = 0) -> torch.Tensor:
        """Logits of tokens fed after the cached prefix. ``slots``: their cache indices [width];
        ``positions``: each row's position ids [rows, width] where rows are left-padded (default: the slots);
        ``extra``: the prefix's :meth:`_prefix_extra`; ``keep``: transformers' ``logits_to_keep`` (0: every
        position; n: the last n; [rows, k] indices: those of each row), so the vocabulary projection runs only
        where logits are read."""
        position_ids = slots[None].expand(input_ids.shape[0], -1) if positions is None else positions
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache_position=slots,
            use_cache=True, logits_to_keep=keep, **{self._cache_argument: cache},
        ).logits

    # ---- decoding variants (beam search, sampling, VCD): models/decoding.py -----------------------------
    def decode_answers(self, questions: list[Question], multiple_choice: bool) -> list[tuple[int | None, str]]:
        """Each question decoded with the variant (greedy, beam, sampling, OPERA; VCD on top): (first token,
        text)."""
        return self._decode(questions, multiple_choice, self.variant.decoding)

    def continue_answers(self, questions: list[Question], multiple_choice: bool) -> list[str]:
        """Greedy decoding of ``continue_tokens`` more tokens after the first (the scoring argmax), on the
        cached image prefix like every other decoding."""
        return [text for _, text in self._decode(questions, multiple_choice, "greedy")]

    @torch.inference_mode()
    def _decode(self, questions: list[Question], multiple_choice: bool,
                decoding_name: str) -> list[tuple[int | None, str]]:
        """Questions decode in one batch per image on its cached prefix (all images of the call together with
        :attr:`cross_image_batches`), expanded per row and beam: the prompts' own tokens run once more to open
        the rows. Without a shared prefix (InstructBLIP), one batch per image and prompt length."""
        variant = self.variant
        beams = variant.num_beams if decoding_name == "beam" else 1
        new_tokens = self.continue_tokens + 1 if decoding_name == "greedy" else variant.max_new_tokens
        answers: list[tuple[int | None, str]] = [(None, "")] * len(questions)
        texts = [self.render(q, multiple_choice) for q in questions]
        errors, items = self._open_items(questions, texts)
        for i, error in enumerate(errors):
            if error is not None:
                raise ValueError(error)
        stop = self._stop_tokens()
        kept = (self._openings or {}).get(False) or {}
        opened = None if all((path, text) in kept for path, _, text in items) else self._open_rows(items, False)
        kept_noised = (self._openings or {}).get(True) or {}
        opened_noised = self._open_rows(items, True) if variant.vcd is not None and opened is not None \
            and not all((path, text) in kept_noised for path, _, text in items) else None
        batches: dict[tuple, list[int]] = {}
        for i, item in enumerate(items):
            if (item[0], item[2]) in kept:  # rows of the scoring batches: the decoding starts from them
                stepper = kept[item[0], item[2]][0]
                key = ("kept",) if self._joins(stepper) else ("kept", id(stepper))
            elif opened.suffix[i] is None:  # whole prompts: one batch per image and token length
                key = ("full", item[0], opened.length[i])
            else:
                key = ("prefix", opened.prefix_length[i] if self.cross_image_batches else opened.prefix_key[i])
            batches.setdefault(key, []).append(i)
        if decoding_name not in ("beam", "sample", "greedy", "opera"):
            raise NotImplementedError(f"decoding '{decoding_name}' is not implemented for {self.backend}")
        streams = 2 if variant.vcd is not None else 1
        width = variant.num_beams if decoding_name in ("beam", "opera") else 1

        def run(rows: list[int]) -> list[list[int]]:
            if decoding_name == "opera":
                return self._opera_rows([items[i] for i in rows], new_tokens)
            first, stepper = self._open_stepper([items[i] for i in rows], beams, opened and (opened, rows),
                                                opened_noised and (opened_noised, rows))
            if decoding_name == "beam":
                return decoding.beam_search(first, stepper, beams, new_tokens, stop, variant.length_penalty)
            if decoding_name == "sample":
                seeds = [question_seed(questions[i].question_id, variant.seed) for i in rows]
                return decoding.sample_search(first, stepper, new_tokens, stop, seeds,
                                              variant.temperature, variant.top_k, variant.top_p)
            return decoding.greedy_search(first, stepper, new_tokens, stop)

        for rows in batches.values():
            # every beam (and VCD's second stream) holds its own cache: at most as many cached rows as a batch
            # has questions (the call's, or batch_rows when the call is larger), the memory it was chosen for
            size = min(len(questions), self.batch_rows or len(questions)) // (width * streams)
            self._record(answers, rows, self._with_shrinking_batches(run, rows, size, combine=_concatenated))
        for kept_rows in (self._openings or {}).values():  # decoded: their scoring rows are no longer needed
            for path, _, text in items:
                kept_rows.pop((path, text), None)
        return answers

    def _record(self, answers: list, rows: list[int], tokens: list[list[int]]) -> None:
        for i, row in zip(rows, tokens):
            answers[i] = (row[0] if row else None, self.tokenizer.decode(row, skip_special_tokens=True))

    def use_variant(self, variant, where: str = "variant") -> None:
        """As the base class; OPERA also needs the language model's last-layer attention (eager kernel)."""
        super().use_variant(variant, where)
        if variant.decoding == "opera" and getattr(self, "_attention_hook", None) is None:
            use_eager_language_model(self.model)
            last = decoder_layers(self.model)[-1].self_attn

            def keep_last_row(module, args, output):
                weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
                if weights is None:
                    raise RuntimeError(f"models.{self.name}: the last layer returned no attention weights (OPERA "
                                       "needs eager attention in the language model)")
                self._last_attention = weights[:, :, -1, :].float().amax(dim=1)

            self._attention_hook = last.register_forward_hook(keep_last_row)

    def _opera_rows(self, items: list[tuple], new_tokens: int) -> list[list[int]]:
        """OPERA for a batch of questions (:func:`decoding.opera_batch`); a question whose retrospection rolls
        back, or a batch whose image tokens sit at different positions, decodes alone (:meth:`_opera`)."""
        spans = {self._image_span(image, text) for _, image, text in items}
        if len(items) == 1 or len(spans) != 1:
            return [self._opera(*item, new_tokens) for item in items]
        variant = self.variant
        first, stepper = self._open_stepper(items, variant.num_beams)
        attending = _AttentionStepper(self, stepper, first)  # (OPERA does not combine with VCD: one stream)
        span = spans.pop()
        tokens = decoding.opera_batch(
            first, attending, variant.opera, variant.num_beams, new_tokens, self._stop_tokens(), span,
            stepper.prompt_columns, [self._placeholder_length(n, span) for n in stepper.prompt_lengths[::variant.num_beams]],
            variant.length_penalty)
        return [row if row is not None else self._opera(*item, new_tokens) for row, item in zip(tokens, items)]

    @staticmethod
    def _placeholder_length(length: int, image_span: tuple[int, int]) -> int:
        """A prompt's token count with its image tokens (``image_span``, inclusive) counted as one placeholder,
        as the official OPERA LLaVA wrapper's prompt holds the image (its length normalisation)."""
        return length - (image_span[1] - image_span[0])

    def _image_span(self, image, text: str) -> tuple[int, int]:
        """First and last position of the image tokens in the prompt."""
        ids = self.encode_shared_image([text], image)["input_ids"][0]
        positions = torch.nonzero(ids == self._image_token_id()).flatten()
        if len(positions) == 0:
            raise ValueError(f"models.{self.name}: OPERA needs the image tokens in the prompt, found none")
        return int(positions[0]), int(positions[-1])

    def _opera(self, image_path, image, text: str, new_tokens: int) -> list[int]:
        """One question decoded with OPERA (:func:`decoding.opera_search`) on the cached image prefix."""
        variant = self.variant
        encoded = self.encode_shared_image([text], image)

        def reopen():
            first, stepper = self._open_stepper([(image_path, image, text)], variant.num_beams)
            return _AttentionStepper(self, stepper, first)

        opened = reopen()
        span, length = self._image_span(image, text), int(encoded["attention_mask"].sum())
        tokens, rollbacks = decoding.opera_search(
            opened.first, opened, variant.opera, variant.num_beams, new_tokens, self._stop_tokens(), span, length,
            reopen, variant.length_penalty, normalised_length=self._placeholder_length(length, span))
        if rollbacks:
            log.info("%s: OPERA rolled back %d time(s): %s", self.name, len(rollbacks), rollbacks)
        return tokens

    def _stop_tokens(self) -> set[int]:
        """Token ids that end an answer: the tokenizer's and the generation config's end of sequence."""
        stop = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        stop |= set(configured if isinstance(configured, (list, tuple)) else [configured] if configured is not None
                    else [])
        return stop

    def _open_stepper(self, items: list[tuple], repeats: int, opened: tuple[_Rows, list[int]] | None = None,
                      opened_noised: tuple[_Rows, list[int]] | None = None):
        """First-position logits [rows, vocab] and the stepper of ``items`` ((image path, image, text): prompts
        on one prefix length, or of one image and one token length), each row repeated ``repeats`` times;
        VCD: the contrasted pair of a clean and a noised stream. ``opened`` (``opened_noised``): the items already
        tokenized, as rows of an :meth:`_open_rows` result of the clean (noised) images. Both come from the same
        items, so the noised rows split into prefix and suffix where the clean ones do (a shared text header is
        chosen over all the items: opened again on a batch's rows alone, its rows could differ in prefix length)."""
        first, clean = self._stream(items, repeats, noised=False, opened=opened)
        if self.variant.vcd is None:
            return first, clean
        first_noised, noised = self._stream(items, repeats, noised=True, opened=opened_noised)
        return (decoding.contrast(first, first_noised, self.variant.vcd),
                decoding.ContrastedStepper(clean, noised, self.variant.vcd))

    def _stream(self, items: list[tuple], repeats: int, noised: bool,
                opened: tuple[_Rows, list[int]] | None = None):
        """A stepper over ``items``: the scoring pass's (kept openings), else on the cached image prefixes (any
        prompt lengths), else whole prompts."""
        stepper = self._take_opening(items, noised)
        if stepper is not None:
            stepper.repeat(repeats)
            return stepper.first, stepper
        opened, rows = opened or (self._open_rows(items, noised), list(range(len(items))))
        if not any(opened.suffix[i] is None for i in rows):
            prefixes, image_of_row = opened.prefixes_of(rows)
            stepper = _PrefixStepper(self, self._rows_cache(prefixes, image_of_row), opened.prefix_length[rows[0]],
                                     [opened.suffix[i] for i in rows], prefixes[0].extra)
            stepper.repeat(repeats)  # each prompt runs once; its beams start from copies of its cache
            return stepper.first, stepper
        image_path, image, _ = items[0]
        encoded = self.encode_shared_image([text for *_, text in items], image)
        if noised:
            encoded = self._noised_inputs(encoded, image_path)
        repeated = {key: value.repeat_interleave(repeats, 0) if isinstance(value, torch.Tensor) else value
                    for key, value in encoded.items()}
        if "image_grid_thw" in encoded:  # Qwen: patches are rows of pixel_values, one grid per image
            repeated["pixel_values"] = encoded["pixel_values"].repeat(repeats, 1)
            repeated["image_grid_thw"] = encoded["image_grid_thw"].repeat(repeats, 1)
        stepper = _FullStepper(self, repeated)
        return stepper.first, stepper

    def _step_forward(self, input_ids, attention_mask, cache) -> torch.Tensor:
        """Logits of one more token per row on a cache that already holds the image (no pixels again)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True,
                          **{self._cache_argument: cache}).logits

    @torch.inference_mode()
    def _generate(self, questions: list[Question], max_new_tokens: int) -> list[str]:
        texts = []
        for question in questions:
            encoded = self.encode([self.render(question, None)], [self.open_image(question.image)])
            output = self.model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)
            texts.append(self.tokenizer.decode(output[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True))
        return texts


class _PrefixStepper:
    """Rows decoding on a cached image prefix: the prompts' own tokens first, then one token per step.

    Prompts of different lengths share one batch: each is left-padded inside the suffix region (the
    padding masked out) and keeps its own position ids, so a row decodes as it would alone.
    """

    def __init__(self, vlm: TransformersVLM, cache, prefix_length: int, suffixes: list[torch.Tensor], extra=None):
        self.vlm, self.cache, self.extra, rows = vlm, cache, extra, len(suffixes)
        device = vlm.device
        lengths = torch.tensor([len(row) for row in suffixes], device=device)
        width = int(lengths.max())
        pad = vlm.tokenizer.pad_token_id or 0
        input_ids = torch.full((rows, width), pad, dtype=torch.long, device=device)
        for r, row in enumerate(suffixes):
            input_ids[r, width - len(row):] = row
        columns = torch.arange(width, device=device)
        real = columns[None] >= (width - lengths)[:, None]
        self.mask = torch.cat([torch.ones((rows, prefix_length), dtype=torch.long, device=device), real.long()], 1)
        self.length = prefix_length + width  # cache slots filled
        #: where the decoded tokens' keys start, and each row's own prompt length (OPERA's columns)
        self.prompt_columns, self.prompt_lengths = self.length, (prefix_length + lengths).tolist()
        #: the position id of each row's next token (its prefix plus its own suffix, padding not counted)
        self.next_position = prefix_length + lengths
        positions = (prefix_length + columns[None] - (width - lengths)[:, None]).clamp(min=prefix_length)
        slots = torch.arange(prefix_length, self.length, device=device)
        self.first = vlm._suffix_forward(input_ids, self.mask, self.cache, slots, positions, extra,
                                         keep=1)[:, -1].float()

    @classmethod
    def joined(cls, picks: list[tuple["_PrefixStepper", int]]) -> "_PrefixStepper":
        """One stepper over rows of several, in the order of ``picks`` ((stepper, row) each; a row may be picked
        twice): their caches side by side, right-padded to the longest with the padding masked out, so that rows
        of different prefix and prompt lengths decode in one batch. A step attends to every unmasked key
        whatever its column (a cached key carries the position it was computed at; each row keeps its own next
        position)."""
        sample, rows = picks[0][0], len(picks)
        length = max(stepper.length for stepper, _ in picks)
        sources: dict[int, tuple[_PrefixStepper, list[int], list[int]]] = {}  # stepper -> (it, its rows, where)
        for position, (stepper, row) in enumerate(picks):
            entry = sources.setdefault(id(stepper), (stepper, [], []))
            entry[1].append(row)
            entry[2].append(position)
        blank = lambda like: like.new_zeros((rows, *like.shape[1:-2], length, like.shape[-1]))  # noqa: E731
        data = [(blank(layer.keys), blank(layer.values)) for layer in sample.cache.layers]
        other = object.__new__(cls)
        other.vlm, other.extra, other.length = sample.vlm, None, length
        other.mask = sample.mask.new_zeros((rows, length))
        other.next_position = sample.next_position.new_empty(rows)
        other.first = sample.first.new_empty((rows, *sample.first.shape[1:]))
        other.prompt_lengths = [0] * rows
        other.prompt_columns = None  # the rows' prompts end at different columns (OPERA does not join)
        for stepper, members, positions in sources.values():
            take = torch.tensor(members, device=stepper.mask.device)
            put = torch.tensor(positions, device=stepper.mask.device)
            for (keys, values), layer in zip(data, stepper.cache.layers):
                keys[put, ..., : stepper.length, :] = layer.keys.index_select(0, take)
                values[put, ..., : stepper.length, :] = layer.values.index_select(0, take)
            other.mask[put, : stepper.length] = stepper.mask[take]
            other.next_position[put] = stepper.next_position[take]
            other.first[put] = stepper.first[take.to(stepper.first.device)]
            for member, position in zip(members, positions):
                other.prompt_lengths[position] = stepper.prompt_lengths[member]
        other.cache = sample.vlm._cache_of(data)
        return other

    def subset(self, rows: list[int]) -> "_PrefixStepper":
        """A new stepper on ``rows`` of this one (copies of their cache rows; this one is unchanged)."""
        index = torch.tensor(rows, device=self.vlm.device)
        other = object.__new__(_PrefixStepper)
        other.vlm, other.extra, other.length, other.prompt_columns = self.vlm, self.extra, self.length, \
            self.prompt_columns
        other.cache = self.vlm._cache_of([(layer.keys.index_select(0, index), layer.values.index_select(0, index))
                                          for layer in self.cache.layers])
        other.mask, other.next_position, other.first = self.mask[index], self.next_position[index], self.first[index]
        other.prompt_lengths = [self.prompt_lengths[row] for row in rows]
        return other

    def repeat(self, times: int) -> None:
        """Each row ``times`` times in a row (beams of one question), cache included."""
        if times == 1:
            return
        rows = torch.arange(len(self.prompt_lengths), device=self.vlm.device).repeat_interleave(times)
        self.reorder(rows)
        self.first = self.first[rows]
        self.prompt_lengths = [length for length in self.prompt_lengths for _ in range(times)]

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        device = self.vlm.device
        slots = torch.tensor([self.length], device=device)
        self.length += 1
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        positions = self.next_position[:, None]
        self.next_position = self.next_position + 1
        logits = self.vlm._suffix_forward(tokens.to(device)[:, None], self.mask, self.cache, slots, positions,
                                          self.extra)
        return logits[:, -1].float()

    def reorder(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.vlm.device)
        self.cache.reorder_cache(rows)
        self.mask, self.next_position = self.mask[rows], self.next_position[rows]

    def undo(self) -> None:
        """Forget the last fed token (OPERA's candidate probes)."""
        self.length -= 1
        self.mask, self.next_position = self.mask[:, :-1], self.next_position - 1
        self.cache.crop(-1)  # transformers 5.x: a negative count removes that many tokens


class _FullStepper:
    """Rows decoding from whole prompts (no shared prefix: InstructBLIP's Q-Former reads the question)."""

    def __init__(self, vlm: TransformersVLM, encoded: dict):
        self.vlm = vlm
        output = vlm.model(**encoded, use_cache=True)
        inner = output.get("language_model_outputs") or output  # InstructBLIP keeps the cache one level down
        self.cache = inner.get("cache") or inner.get("past_key_values")
        self.mask = encoded["attention_mask"]
        self.prompt_columns, self.prompt_lengths = self.mask.shape[1], self.mask.sum(dim=1).tolist()
        self.first = output.logits[:, -1].float()

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        return self.vlm._step_forward(tokens.to(self.vlm.device)[:, None], self.mask, self.cache)[:, -1].float()

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows.to(self.vlm.device))
        self.mask = self.mask[rows.to(self.mask.device)]

    def undo(self) -> None:
        self.mask = self.mask[:, :-1]
        self.cache.crop(-1)


class _AttentionStepper:
    """A stepper that also reads the last layer's attention row of each fed token (OPERA)."""

    def __init__(self, vlm: TransformersVLM, inner, first: torch.Tensor):
        self.vlm, self.inner, self.first = vlm, inner, first

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.inner.advance(tokens)
        self.attention = self.vlm._last_attention
        return logits

    def probe(self, candidates: torch.Tensor) -> torch.Tensor:
        rows = []
        for column in range(candidates.shape[1]):
            self.inner.advance(candidates[:, column])
            rows.append(self.vlm._last_attention)
            self.inner.undo()
        return torch.stack(rows, dim=1)

    def reorder(self, rows: torch.Tensor) -> None:
        self.inner.reorder(rows)


class LlavaVLM(TransformersVLM):
    """LLaVA-1.5 in the llava-hf layout (``LlavaForConditionalGeneration`` + ``LlavaProcessor``).

    ``conversation: llava_v1`` (or ``vicuna_v1``) renders the original LLaVA
    repository's format instead of the llava-hf chat template: the same turn
    with the system sentence in front (docs/models.md, "Prompts").
    """

    backend = "llava"
    model_class = "LlavaForConditionalGeneration"
    cross_image_batches = True  # every image is the same number of tokens after the same text
    shared_prefix_attention = True
    conversations = (CHAT_TEMPLATE, *CONVERSATIONS)


class InstructBlipVLM(TransformersVLM):
    """InstructBLIP: its Q-Former reads the question, so no prefix can be shared; batched full forwards."""

    backend = "instructblip"
    supports_prefix_reuse = False
    model_class = "InstructBlipForConditionalGeneration"

    def render_turn(self, text: str) -> str:
        """InstructBLIP takes the bare instruction (its processor prepends the query tokens)."""
        return text

    def encode(self, texts, images, padding_side: str = "right"):
        self.processor.qformer_tokenizer.padding_side = "right"  # the Q-Former reads the text bidirectionally
        return super().encode(texts, images, padding_side)

    def encode_shared_image(self, texts, image):
        return self.encode(texts, [image] * len(texts))

    def _step_forward(self, input_ids, attention_mask, cache):
        """Past the prompt only the language model runs (the image lives in the cache of the query tokens)."""
        language_model = self.model.language_model
        parameters = inspect.signature(language_model.forward).parameters
        argument = "cache" if "cache" in parameters else "past_key_values"
        output = language_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True,
                                **{argument: cache})
        return output.logits if hasattr(output, "logits") else self.model.get_output_embeddings()(output[0])

    @torch.inference_mode()
    def _generate(self, questions, max_new_tokens):
        texts = []
        for question in questions:
            encoded = self.encode([self.render(question, None)], [self.open_image(question.image)])
            output = self.model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)
            texts.append(self.tokenizer.decode(output[0], skip_special_tokens=True))
        return texts


class QwenVLM(TransformersVLM):
    """Qwen2-VL and Qwen2.5-VL: M-RoPE positions, images as flattened patches with a grid per image."""

    backend = "qwen2_vl"

    def _load_processor(self, path, load):
        from transformers import AutoProcessor

        try:
            return AutoProcessor.from_pretrained(path, **load)
        except (OSError, ImportError, ValueError) as error:  # no torchvision -> no video processor
            import transformers
            from transformers import AutoImageProcessor, AutoTokenizer

            config = transformers.AutoConfig.from_pretrained(path, **load)
            name = "Qwen2_5_VLProcessor" if config.model_type == "qwen2_5_vl" else "Qwen2VLProcessor"
            log.info("%s: loading an images-only %s (%s)", self.name, name, error)
            tokenizer = AutoTokenizer.from_pretrained(path, **load)
            return images_only_processor(getattr(transformers, name))(
                image_processor=AutoImageProcessor.from_pretrained(path, **load), tokenizer=tokenizer,
                chat_template=tokenizer.chat_template,
            )

    def _image_inputs(self, first, rows):
        """Qwen stores an image as flattened patches plus its grid: one copy of both per row."""
        return {"pixel_values": first["pixel_values"].repeat(rows, 1), "image_grid_thw": first["image_grid_thw"].repeat(rows, 1)}

    def _prefix_inputs(self, prefix_ids, encoded):
        patches = int(encoded["image_grid_thw"][0].prod())
        return {
            "input_ids": prefix_ids[None],
            "attention_mask": torch.ones_like(prefix_ids)[None],
            "pixel_values": encoded["pixel_values"][:patches],
            "image_grid_thw": encoded["image_grid_thw"][:1],
            "mm_token_type_ids": (prefix_ids == self._image_token_id()).long()[None],
        }

    def _prefix_extra(self):
        """The image's M-RoPE offset, which the text after it needs (set by the prefix pass just run)."""
        return self.model.model.rope_deltas.clone()

    def _step_forward(self, input_ids, attention_mask, cache):
        """One token after whole prompts (no prefix reuse): its M-RoPE position is the row's token count plus
        the rope delta the prompt pass stored (transformers would derive it from the whole mask, wrongly)."""
        delta = self.model.model.rope_deltas.to(self.device)
        text = attention_mask.sum(dim=1, keepdim=True) - 1
        position_ids = (text + delta).expand(3, -1, -1)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **{self._cache_argument: cache}).logits

    def _suffix_forward(self, input_ids, attention_mask, cache, slots, positions=None, extra=None, keep=0):
        """Text after the image: position = index + the image's rope delta (``extra``), on all three M-RoPE
        axes."""
        rope_delta = extra.to(self.device)
        text = slots[None].expand(input_ids.shape[0], -1) if positions is None else positions
        position_ids = (text + rope_delta).expand(3, -1, -1)
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            cache_position=slots, use_cache=True, logits_to_keep=keep, **{self._cache_argument: cache},
        ).logits
