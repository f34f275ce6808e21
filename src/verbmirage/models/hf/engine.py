"""The transformers engine: any vision-language model that loads with transformers, from prompts to logits.

Scoring reads the logits of the first answer position (no generation):
P(yes) = softmax mass of the "yes" spellings over yes+no spellings, and
``yes_margin`` = logsumexp of their logits minus that of the "no" logits (float64,
so it still ranks answers where P(yes) rounds to 1.0); MC = mass
of each option letter's tokens, renormalised; ``confidence`` = the probability
of the answer's first token in the distribution it was drawn from (paper Eq. 2;
greedy: the softmax there, whose argmax it is); the raw answer is the decoded
first token, or the decoded text where that token decides nothing.

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

The engine's parts, by concern. The engine holds four collaborators; the first three read of it only what
their Protocol declares (the fourth gets the model alone); the caches that outlive a call live in the
collaborator that owns them, and nothing else a later call needs is left on the engine by an earlier one (the
decoder keeps nothing: a scoring call hands its rows to the decoding as an argument):

- ``inputs``, a :class:`~.inputs.PromptInputs` (:mod:`.inputs`): prompt rendering and processor inputs; owns the
  opened images of the current call and their encodings (``InputsHost``);
- ``prefix_cache``, a :class:`~.prefix_cache.PrefixCache` (:mod:`.prefix_cache`): the kept image prefixes and the
  suffix batches (``PrefixHost``);
- ``decoder``, a :class:`~.decode.Decoder` (:mod:`.decode`): decodings past the first answer token, from what a
  scoring call hands it (:mod:`.handoff`; ``DecoderHost``), on the rows of :mod:`.steppers`, which read of the
  engine only what ``StepperHost`` declares (its forwards after a prefix are the ``prefix_cache``'s; the
  strategies themselves are :mod:`verbmirage.variants.strategies`);
- ``last_attention``, a :class:`~.last_attention.LastAttention` (:mod:`.last_attention`): OPERA's switch to eager
  attention and the row its hook keeps, set by :meth:`~TransformersVLM.use_variant` for a variant that reads it
  and undone by the next that does not.

The names these Protocols declare are the engine's public contract with its collaborators (no underscore).

The engine itself derives from :class:`~.scoring.LogitsVLM` (logits to answers) and runs the scoring pass; the
families (:mod:`.families`: LLaVA, InstructBLIP, Qwen2-VL) declare what differs, naming their own subclass of a
collaborator where its work differs (``inputs_class``, ``prefix_cache_class``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math

import torch

from verbmirage.core.imaging import open_rgb
from verbmirage.models.adapters import attach_adapter
from verbmirage.models.base import Question, allow_remote_code
from verbmirage.models.hf.decode import Decoder
from verbmirage.models.hf.handoff import Openings
from verbmirage.models.hf.inputs import PromptInputs, by_image
from verbmirage.models.hf.last_attention import LastAttention
from verbmirage.models.hf.memory import engine_memory_costs
from verbmirage.models.hf.on_device import engine_device_path, fit_to_device
from verbmirage.models.hf.prefix_cache import PrefixCache
from verbmirage.models.hf.scoring import DecodedAnswer, LogitsVLM
from verbmirage.models.hf.tokens import DTYPES, is_out_of_memory
from verbmirage.models.prompts import CHAT_TEMPLATE, PromptTemplate
from verbmirage.models.registry import IMAGE_MODES
from verbmirage.variants.settings import ALL_FEATURES

log = logging.getLogger(__name__)


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
    #: OPERA's step in one forward (the candidates' forward feeds the chosen one): set on CUDA by
    #: :func:`~.on_device.fit_to_device`; the CPU keeps two forwards per step.
    opera_one_forward = False
    #: The collaborators' classes: a family whose rendering, encoding or forward after a prefix differs names its
    #: subclass here (families.py).
    inputs_class: type[PromptInputs] = PromptInputs
    prefix_cache_class: type[PrefixCache] = PrefixCache

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
        self.image_mode, self.shipped_mode = image_mode or modes[0], modes[0]
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
        self.inputs = self.inputs_class(self)  # prompts and processor inputs; the call's images (hf/inputs.py)
        self.prefix_cache = self.prefix_cache_class(self)  # the kept image prefixes (hf/prefix_cache.py)
        fit_to_device(self)  # on CUDA: fuller forwards, compiled decoder layers (hf/on_device.py)
        # transformers 5.2x renamed the cache argument `past_key_values` -> `cache`.
        parameters = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.decoder = Decoder(self)  # decodings past the first answer token (hf/decode.py)
        self.last_attention = LastAttention(self.model)  # OPERA's eager attention, while its variant is set

    # ---- loading (override per family) ------------------------------------
    def _load_processor(self, path: str, load: dict):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path, **load)

    def _load_model(self, path: str, load: dict, attn_implementation: str | None):
        import transformers

        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model_class = getattr(transformers, self.model_class)
        return model_class.from_pretrained(path, dtype=self.dtype, **load, **extra)

    # ---- prompts and inputs (the public face of ``inputs``) ------------------------
    def render(self, question: Question, multiple_choice: bool | None) -> str:
        """The full prompt text of ``question`` (:meth:`~.inputs.PromptInputs.render`)."""
        return self.inputs.render(question, multiple_choice)

    def render_turn(self, text: str) -> str:
        """One user turn of ``text`` and the opening of the answer (:meth:`~.inputs.PromptInputs.render_turn`)."""
        return self.inputs.render_turn(text)

    def encode(self, texts: list[str], images: list, padding_side: str = "right"):
        """The processor's encoding of ``texts`` with ``images`` on the model's device
        (:meth:`~.inputs.PromptInputs.encode`)."""
        return self.inputs.encode(texts, images, padding_side)

    def encode_shared_image(self, texts: list[str], image) -> dict:
        """``encode(texts, [image] * n)``, the image preprocessed once (:meth:`~.inputs.PromptInputs.
        encode_shared_image`)."""
        return self.inputs.encode_shared_image(texts, image)

    def prompt_ids(self, text: str, image):
        """One prompt's token ids on the host (:meth:`~.inputs.PromptInputs.prompt_ids`)."""
        return self.inputs.prompt_ids(text, image)

    def prepare_image(self, image):
        """``image`` as the processor gets it under :attr:`image_mode` (:meth:`~.inputs.PromptInputs.
        prepare_image`)."""
        return self.inputs.prepare_image(image)

    open_image = staticmethod(open_rgb)

    def image_token_id(self) -> int | None:
        config = self.model.config
        return getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)

    # ---- the engine -----------------------------------------------------------
    mixed_kinds = True
    #: Whether the prefixes of several images can run as one batch and their questions share suffix batches
    #: (batch-first image tensors, one prefix length for every image: LLaVA). Otherwise each image alone.
    cross_image_batches: bool = False
    #: Whether the family's suffix batches may read their prefixes in place (``prefix_cache.reads_in_place``).
    shared_prefix_attention: bool = False
    #: At most this many image prefixes are kept (clean and VCD-noised count apart), and only those of the
    #: current call's images (for its decoding, and the next call if it continues an image).
    PREFIX_SLOTS = 32

    def forget_prefixes(self) -> None:
        """Drop the kept image prefixes and image encodings (benchmarks start cold; out of memory frees them)."""
        self.prefix_cache.clear()
        self.inputs.forget()

    @torch.inference_mode()
    def answer_logits(self, questions: list[Question], multiple_choice) -> tuple[torch.Tensor, list, list, Openings]:
        """``multiple_choice``: one flag for all questions, or one per question (YN and MC of an image together).
        The third element holds each question's VCD statistics (``vcd_kl``, ``vcd_kl_reverse``, ``vcd_plausible``;
        VCD only); the fourth is the hand-off to the decoding of these questions (:class:`~.handoff.Openings`)."""
        flags = multiple_choice if isinstance(multiple_choice, (list, tuple)) else [multiple_choice] * len(questions)
        texts = [self.render(q, flag) for q, flag in zip(questions, flags)]
        logits = torch.full((len(questions), self.model.config.get_text_config().vocab_size), math.nan)
        # a new call: from now on only its images keep their encoding and prefix (a 7B model's prefix is ~0.3 GB)
        errors, items = self.inputs.open_items(questions, texts, new_call=True)
        self.prefix_cache.keep_only(self.inputs.opened_paths())
        # beam search, sampling and OPERA decode every question of the call next, greedy decoding (without VCD)
        # the questions whose first token decides nothing: they start from the scoring pass's rows
        strategy = self.strategy
        kinds = {(item[0], item[2]): flag for item, flag in zip(items, flags) if item is not None}
        openings = Openings.keeping(kinds) if self.prefix_reuse and strategy.keeps_openings(self.continue_tokens) \
            else Openings(kinds)
        columns: list[dict] = [{}] * len(questions)
        valid = [i for i, error in enumerate(errors) if error is None]
        if valid:
            chosen = [items[i] for i in valid]
            # VCD: the same questions on the noised images too; on kept prefixes both streams in the same forwards
            streams = (False, True) if strategy.streams > 1 else (False,)
            if self.prefix_reuse:
                values = self.with_shrinking_batches(
                    functools.partial(self._prefix_logits, streams=streams, openings=openings), chosen,
                    combine=functools.partial(torch.cat, dim=1), openings=openings)
            else:
                values = torch.stack([self.with_shrinking_batches(functools.partial(self._full_logits, noised=noised),
                                                                  chosen) for noised in streams])
            if strategy.streams > 1:  # VCD's contrast
                values, contrast_columns = strategy.contrast_first(values[0], values[1])
                for i, own in zip(valid, contrast_columns):
                    columns[i] = own
            else:
                values = values[0]
            logits[valid] = values
        return logits, errors, columns, openings

    def with_shrinking_batches(self, method, items: list, size: int | None = None, combine=torch.cat,
                                openings: Openings | None = None):
        """Run ``method`` on chunks of ``items`` (at most ``size``; default all); on out-of-memory halve the
        chunk and retry, kept prefixes and ``openings`` freed. ``combine`` joins the chunks' results."""
        size, start, parts = max(1, size or len(items)), 0, []
        while start < len(items):
            chunk = items[start : start + size]
            try:
                parts.append(method(chunk))
                start += len(chunk)
            except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
                if not is_out_of_memory(error) or size == 1:
                    raise
                size = max(1, size // 2)
                self.forget_prefixes()
                openings and openings.drop()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                log.warning("%s: out of memory, batch halved to %d", self.name, size)
        return combine(parts)

    def _forward(self, **inputs) -> torch.Tensor:
        return self.model(**inputs, use_cache=False).logits

    def _full_logits(self, items: list[tuple], noised: bool = False) -> torch.Tensor:
        """Whole prompts, one right-padded batch per image; logits at each row's last real token."""
        result = None
        for indices in by_image(items).values():
            image_path, image, _ = items[indices[0]]
            encoded = self.encode_shared_image([items[i][2] for i in indices], image)
            if noised:
                encoded = self.noised_inputs(encoded, image_path)
            logits = self._forward(**encoded)
            last = encoded["attention_mask"].sum(dim=1) - 1
            values = logits[torch.arange(len(indices)), last].float().cpu()
            result = torch.empty(len(items), values.shape[1]) if result is None else result
            result[indices] = values
        return result

    def _prefix_logits(self, items: list[tuple], streams: tuple[bool, ...] = (False,),
                       openings: Openings | None = None) -> torch.Tensor:
        """Each image's prefix once (kept for the next call), then the suffixes in length-sorted batches: the
        first-position logits [streams, items, vocab] (``streams``: the clean images, and VCD's noised ones).

        The prefix ends right after the image tokens: every prompt of an image (YN and MC, any question
        set, any batch) has that same prefix, so it is computed once per image however the questions are
        batched. Where images share one prefix length (:attr:`cross_image_batches`), their prefixes run as
        one batch and their questions share suffix batches, each row on its own image's prefix (kept in ``openings``
        as the openings of a decoding, where it keeps them); a noised image's prefix and rows join the clean ones'.
        """
        opened = self.prefix_cache.open_rows(items, streams)
        result = None
        for noised in streams:
            fallback = [row for row in opened.fallback if opened.noised(row) == noised]
            if fallback:
                values = self._full_logits([items[opened.item(row)] for row in fallback], noised)
                result = torch.empty(len(streams) * len(items), values.shape[1]) if result is None else result
                result[fallback] = values
        for batch in self.prefix_cache.suffix_batches(opened):
            values = self.prefix_cache.suffix_batch(opened, batch) if openings is None or openings.kept is None else \
                self.decoder.kept_opening(opened, batch, items, openings, self.strategy)
            result = torch.empty(len(streams) * len(items), values.shape[1]) if result is None else result
            result[batch] = values
        return result.view(len(streams), len(items), -1)

    #: The caller's batch size (:meth:`use_batch_size`); None: not given, a call is one batch.
    batch_size: int | None = None
    #: A call holds this many batches' worth of questions where :meth:`calls_span_batches` (below).
    CALL_BATCHES = 4

    def calls_span_batches(self) -> bool:
        """Whether a call holds :attr:`CALL_BATCHES` batches' worth of questions, each forward at most one batch:
        on a model whose images share suffix batches (LLaVA), for greedy variants, and for every decoding whose
        rows read their prefixes in place (a decoding row then holds only its own columns, so the call's
        questions decode together in one batch: fewer step forwards per question)."""
        return self.prefix_reuse and self.cross_image_batches and (
            self.strategy.call_spans_batches or self.prefix_cache.reads_in_place())

    @property
    def batch_rows(self) -> int | None:
        """At most this many rows per forward (suffix batches, decodings) where a call holds several batches;
        None: the call is one batch."""
        return self.batch_size if self.calls_span_batches() else None

    def use_batch_size(self, batch_size: int) -> int:
        """``CALL_BATCHES`` batches' worth of questions per call where :meth:`calls_span_batches` (fuller
        forwards, and decodings that step a whole call's questions together; bench/README.md, "Calls of several
        batches"), each forward still at most ``batch_size`` rows. Otherwise (beam search, sampling and OPERA on
        rows that copy their prefix, which grow with the call as a batch does) one batch per call."""
        self.batch_size = batch_size
        return batch_size * self.CALL_BATCHES if self.calls_span_batches() else batch_size

    memory_costs = engine_memory_costs  # a question's and an image's memory under the variant (hf/memory.py)
    device_path = engine_device_path  # the GPU and the kernels its generation chose (hf/on_device.py)

    def noised_inputs(self, encoded: dict, image_path) -> dict:
        """``encoded`` with VCD's diffusion noise on the pixel tensor, the same noise for every row of the image
        (the strategy's :meth:`~verbmirage.variants.vcd.ContrastiveDecoding.noised_pixels`)."""
        pixels = encoded["pixel_values"]
        rows = encoded["input_ids"].shape[0]
        per_image = pixels.shape[0] // rows
        one = self.strategy.noised_pixels(pixels[:per_image], image_path)
        return {**encoded, "pixel_values": one.repeat(rows, *[1] * (pixels.dim() - 1))}

    def use_variant(self, variant, where: str = "variant") -> None:
        """As the base class; a strategy that reads the last layer's attention (OPERA) gets it: computed by the
        attention that reads prefixes in place (``steppers.InPlaceStepper``), else from eager attention
        (:meth:`keep_last_attention`). A variant that reads none undoes that switch: the model runs the attention
        it was loaded with again (and reads its prefixes in place where the family allows it)."""
        super().use_variant(variant, where)
        if not self.strategy.needs_last_attention:
            self.last_attention.release()
        elif not self.prefix_cache.reads_in_place():
            self.keep_last_attention()

    def keep_last_attention(self) -> None:
        """Eager attention in the language model and a hook that keeps the last layer's attention row of the
        last fed token, max over heads, for steppers that copy their prefix (:class:`~.last_attention.
        LastAttention`, the engine's ``last_attention``, owns all three until a variant that reads no attention
        is set)."""
        self.last_attention.keep()

    def decode_answers(self, questions: list[Question], multiple_choice: bool,
                       openings: Openings | None = None) -> list[DecodedAnswer]:
        """Each question decoded with the variant's strategy (greedy, beam, sampling, OPERA; VCD on top): (first
        token, text, the first token's probability in the distribution the first step drew it from), continued
        from ``openings`` (their scoring call's hand-off) or without it from the prompts, to the same answers."""
        return self.decoder.decode(questions, multiple_choice, self.strategy, openings)

    def continue_answers(self, questions: list[Question], multiple_choice: bool,
                         openings: Openings | None = None) -> list[str]:
        """``continue_tokens`` more tokens after the first (the scoring argmax), decoded by the variant's own
        strategy (greedy, or a subclass of it: its :meth:`~verbmirage.variants.strategies.Decoding.
        logits_processors` included), like :meth:`decode_answers`."""
        return [answer.text for answer in self.decoder.decode(questions, multiple_choice, self.strategy, openings)]

    def stop_tokens(self) -> set[int]:
        """Token ids that end an answer: the tokenizer's and the generation config's end of sequence."""
        stop = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        stop |= set(configured if isinstance(configured, (list, tuple)) else [configured] if configured is not None
                    else [])
        return stop

    def step_state(self) -> torch.Tensor | None:
        """What the whole-prompt forward just run leaves that later steps of its rows read (a tensor with a row
        per prompt; :class:`~.steppers.FullStepper` keeps it with its rows and hands it to :meth:`step_forward`),
        or None."""
        return None

    def step_forward(self, input_ids, attention_mask, cache, state: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of one more token per row on a cache that already holds the image (no pixels again);
        ``state``: the rows' :meth:`step_state`."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True,
                          **{self.cache_argument: cache}).logits

    @torch.inference_mode()
    def _generate(self, questions: list[Question], max_new_tokens: int) -> list[str]:
        texts = []
        for question in questions:
            encoded = self.encode([self.render(question, None)], [self.open_image(question.image)])
            output = self.model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)
            texts.append(self.tokenizer.decode(output[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True))
        return texts
