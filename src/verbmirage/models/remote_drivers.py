"""Drivers of the paper's remote-code checkpoints, each with its load-time patches for transformers 5.x:
Qwen-VL-Chat and Molmo-7B-D here, the two on a Llama language model (MiniCPM-Llama3-V-2.5, mPLUG-Owl2) in
:mod:`remote_drivers_llama`; :data:`DRIVERS` is the table of all four.

Stdlib only at import, like :mod:`remote_worker`, which hosts them (in-process, or in a worker process in
the checkpoint's own environment without the package installed).
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path

if __package__:  # imported as verbmirage.models.remote_drivers
    from verbmirage.models import remote_driver as base
    from verbmirage.models.remote_drivers_llama import MiniCPMVDriver, MplugOwl2Driver
else:  # beside remote_worker.py in a remote-code environment (this folder on sys.path)
    import remote_driver as base  # type: ignore[no-redef]
    from remote_drivers_llama import MiniCPMVDriver, MplugOwl2Driver  # type: ignore[no-redef]


# ---- Qwen-VL-Chat ----------------------------------------------------------------------------------
#: Qwen's tokenizer stores the image path as raw bytes padded to this many tokens; the forward needs one pad.
QWEN_IMAGE_SPAN = 256


def qwen_image_path(image_path: str) -> str:
    """The absolute path Qwen's tokenizer can carry: shorter than 256 UTF-8 bytes."""
    resolved = str(Path(image_path).resolve())
    if len(resolved.encode("utf-8")) >= QWEN_IMAGE_SPAN:
        raise ValueError(
            f"image path {resolved}: Qwen-VL-Chat carries the path inside the prompt and needs it shorter than "
            f"{QWEN_IMAGE_SPAN} UTF-8 bytes (it has {len(resolved.encode('utf-8'))}); use a shorter images folder"
        )
    return resolved


def install_stand_in_module(name: str) -> bool:
    """Put an empty module ``name`` in ``sys.modules`` if it cannot be imported.

    transformers 5.x refuses checkpoint code whose imports are missing, even
    imports inside methods we never call (Qwen's ``chat_stream`` imports
    ``transformers_stream_generator``, whose releases do not import on 5.x).
    """
    try:
        importlib.import_module(name)
        return False
    except Exception:  # noqa: BLE001 - ImportError, or the package's own breakage on 5.x
        sys.modules[name] = types.ModuleType(name)
        return True


def keep_loaded_weights(model_class) -> None:
    """Stop transformers 5.x from re-initialising loaded weights (Qwen-VL-Chat on 5.24: every ``c_proj.weight``).

    Qwen's ``_init_weights`` re-draws ``c_proj.weight`` from the *parent*
    module, which 5.x does not mark as loaded, so a real checkpoint silently
    loses those weights. A full checkpoint has every weight: no init is needed.
    """
    for cls in model_class.__mro__:
        if "_init_weights" in vars(cls) and cls.__module__ == model_class.__module__:
            cls._init_weights = lambda self, module: None


def patch_qwen_for_transformers5(model) -> None:
    """Make Qwen-VL-Chat's modeling code run on transformers 5.x (Q4, Q5).

    5.x builds models on the meta device, so tensors that ``__init__`` stores as
    plain attributes (rotary ``inv_freq``, ``logn_tensor``) and the
    non-persistent ``masked_bias`` never get values; they are recomputed here.
    ``PreTrainedModel.get_head_mask`` is gone. The checkpoint's tuple caches do
    not fit 5.x's cache objects, so :class:`QwenVLChatDriver` generates without
    a cache there (right tokens, quadratic time).
    """
    import torch

    transformer = model.transformer
    device = next(model.parameters()).device
    config = model.config
    for block in transformer.h:
        if hasattr(block.attn, "masked_bias"):
            block.attn.masked_bias = torch.tensor(-1e4, device=device)  # a non-persistent buffer: never loaded
    rotary = transformer.rotary_emb
    if rotary.inv_freq.is_meta or rotary.inv_freq.device != device:
        rotary.inv_freq = 1.0 / (rotary.base ** (torch.arange(0, rotary.dim, 2, device=device).float() / rotary.dim))
        rotary._seq_len_cached, rotary._rotary_pos_emb_cache = 0, None
    for block in transformer.h:
        attention = block.attn
        if hasattr(attention, "logn_tensor") and (attention.logn_tensor.is_meta or attention.logn_tensor.device != device):
            logn = [math.log(i, config.seq_length) if i > config.seq_length else 1 for i in range(1, 32768)]
            attention.logn_tensor = torch.tensor(logn, device=device)[None, :, None, None]
    if not hasattr(type(transformer), "get_head_mask"):
        type(transformer).get_head_mask = lambda self, head_mask, n_layers: [None] * n_layers


class QwenVLChatDriver(base.Driver):
    """Qwen/Qwen-VL-Chat: ChatML via the checkpoint's own ``make_context``; the path travels in the prompt."""

    name = "qwen_vl_chat"
    SYSTEM = "You are a helpful assistant."

    def load(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        load = {"trust_remote_code": True, "revision": self.revision}
        if base._transformers_major() >= 5:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            install_stand_in_module("transformers_stream_generator")
            keep_loaded_weights(get_class_from_dynamic_module("modeling_qwen.QWenLMHeadModel", self.path,
                                                              revision=self.revision))
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, **load)
        # The checkpoint casts itself by its own flags (fp16 in the hub config), not by torch_dtype: set them.
        precision = {flag: self.dtype_name == name for flag, name in
                     (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"))}
        self.model = AutoModelForCausalLM.from_pretrained(self.path, **{base._dtype_kwarg(): self.dtype}, **precision,
                                                          **load)
        self.model = self.model.to(self.device).eval()
        if base._transformers_major() >= 5:
            patch_qwen_for_transformers5(self.model)
            base.check_buffers(self.model, "qwen_vl_chat")
        package = type(self.model).__module__.rsplit(".", 1)[0]
        self._utils = importlib.import_module(f"{package}.qwen_generation_utils")

    @property
    def vocab_size(self) -> int:
        return int(self.model.lm_head.weight.shape[0])

    def image_geometry(self):
        visual = self.model.config.visual  # a fixed 448 px image: its patches, pooled to 256 tokens
        return {"image_tokens": QWEN_IMAGE_SPAN + 2, "vision_tokens": (visual["image_size"] // visual["patch_size"]) ** 2,
                "vision_layers": visual["layers"], "vision_hidden": visual["width"]}

    def _context(self, image_path: str, question: str) -> tuple[str, list[int]]:
        query = self.tokenizer.from_list_format([{"image": qwen_image_path(image_path)}, {"text": question}])
        return self._utils.make_context(self.tokenizer, query, history=[], system=self.SYSTEM,
                                        max_window_size=getattr(self.model.generation_config, "max_window_size", 6144),
                                        chat_format="chatml")

    def prompt_text(self, image_path, question):
        return self._context(image_path, question)[0]

    def prompt_ids(self, image_path, question) -> list[int]:
        return list(self._context(image_path, question)[1])

    def logits(self, image_path, question):
        import torch

        ids = torch.tensor([self.prompt_ids(image_path, question)], device=self.device)
        with torch.inference_mode():
            return self.model(input_ids=ids).logits[0, -1].float().cpu()

    # batches: the image's prompt up to ``</img>`` (and what the questions share after it) runs once; its cache is
    # a tuple per layer, batch first, which the model's forward takes back as ``past_key_values``
    def batch_inputs(self, image_path, questions):
        return [self.prompt_ids(image_path, question) for question in questions], None

    def image_end(self, ids, state):
        return ids.index(self.model.config.visual["image_start_id"] + 1) + 1

    def prefix_cache(self, ids, state):
        import torch

        return self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True).past_key_values

    def suffix_logits(self, rows, past):
        import torch

        ids, _, lengths = base.pad_rows(rows, self.tokenizer.eod_id)
        transformer = self.model.transformer
        build = transformer._prepare_decoder_attention_mask
        done = past[0][0].shape[1]  # its cache is (batch, sequence, heads, dim)

        def causal_mask(attention_mask, input_shape, inputs_embeds, past_length):
            # the checkpoint reads the cached length off size(-2), the heads axis: its own builder gets the true one
            return build(attention_mask, input_shape, inputs_embeds, done)

        transformer._prepare_decoder_attention_mask = causal_mask
        try:
            logits = self.model(input_ids=ids.to(self.device), past_key_values=base.expand_cache(past, len(rows)),
                                use_cache=True).logits
        finally:
            del transformer._prepare_decoder_attention_mask
        return logits[torch.arange(len(rows)), lengths - 1]

    def decode_batch(self, items, max_new_tokens, num_beams, repetition_penalty, sampling):
        """Left-padded rows (``<|endoftext|>``, masked) through the checkpoint's ``generate``; its rotary positions
        count the padding, which shifts every position of a row alike and so leaves its attention unchanged."""
        import torch

        ids, mask, _ = base.pad_rows([self.prompt_ids(image, question) for image, question in items],
                                self.tokenizer.eod_id, left=True)
        stop = self._utils.get_stop_words_ids("chatml", self.tokenizer)
        settings = {"top_p": None, "top_k": None, **base.generation_settings(sampling)}
        with torch.inference_mode():
            output = self.model.generate(
                ids.to(self.device), attention_mask=mask.to(self.device), stop_words_ids=stop,
                max_new_tokens=max_new_tokens, num_beams=num_beams, repetition_penalty=repetition_penalty,
                pad_token_id=self.tokenizer.eod_id, use_cache=base._transformers_major() < 5, **settings,
            )
        return [self._answer(output[i, ids.shape[1]:].tolist()) for i in range(len(items))]

    def _answer(self, new: list[int]) -> tuple[str, list[int]]:
        ends = set(self.stop_ids())
        new = base.trim_after_end(new, ends)
        cut = next((i for i, token in enumerate(new) if token in ends), len(new))
        return self.tokenizer.decode(new[:cut], errors="replace").strip(), new

    def reference_text(self, image_path, question, max_new_tokens, num_beams=1):
        """The checkpoint's own ``chat()`` with sampling switched off (what ``generate`` must agree with)."""
        query = self.tokenizer.from_list_format([{"image": qwen_image_path(image_path)}, {"text": question}])
        text, _ = self.model.chat(self.tokenizer, query=query, history=None, max_new_tokens=int(max_new_tokens),
                                  do_sample=False, top_p=None, top_k=None, num_beams=int(num_beams))
        return text

    def generate(self, image_path, question, max_new_tokens, num_beams=1, repetition_penalty=1.0, sampling=None):
        import torch

        tag = base.sampling_tag(num_beams, repetition_penalty, sampling)
        ids = torch.tensor([self.prompt_ids(image_path, question)], device=self.device)
        stop = self._utils.get_stop_words_ids("chatml", self.tokenizer)
        settings = {"top_p": None, "top_k": None, **base.generation_settings(sampling)}
        with torch.inference_mode():
            output = self.model.generate(
                ids, stop_words_ids=stop, max_new_tokens=max_new_tokens, num_beams=int(num_beams),
                repetition_penalty=float(repetition_penalty), use_cache=base._transformers_major() < 5, **settings,
            )
        text, self.last_token_ids = self._answer(output[0, ids.shape[1]:].tolist())
        return text, tag

    def stop_ids(self):
        """ChatML's turn marks end an answer too."""
        return sorted({self.tokenizer.im_end_id, self.tokenizer.im_start_id, *super().stop_ids()})


# ---- Molmo-7B-D -------------------------------------------------------------------------------------
def patch_molmo_for_transformers5(model_class) -> None:
    """Let MolmoForCausalLM load on transformers 5.x: its ``__init__`` never calls ``post_init()`` (no
    ``all_tied_weights_keys``) and its ``tie_weights`` takes no keyword arguments (its weights are not tied).

    Its generation hooks are not patched: on 5.24 its tuple cache and
    causal-bias cache do not survive the new generation loop, so text decoding
    of Molmo needs its worker env (:meth:`MolmoDriver.generate` says so).
    """
    if not hasattr(model_class, "all_tied_weights_keys"):
        model_class.all_tied_weights_keys = {}
    model_class.tie_weights = lambda self, *args, **kwargs: None


class MolmoDriver(base.Driver):
    """allenai/Molmo-7B-D-0924: ``processor.process`` then the model card's calls, images cast to the weights' dtype."""

    name = "molmo"

    def load(self):
        from transformers import AutoModelForCausalLM, AutoProcessor

        load = {"trust_remote_code": True, "revision": self.revision}
        if base._transformers_major() >= 5:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            patch_molmo_for_transformers5(get_class_from_dynamic_module(
                "modeling_molmo.MolmoForCausalLM", self.path, revision=self.revision))
        self.processor = AutoProcessor.from_pretrained(self.path, **load)
        self.tokenizer = self.processor.tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(self.path, **{base._dtype_kwarg(): self.dtype}, **load)
        self.model = self.model.to(self.device).eval()
        if base._transformers_major() >= 5:
            base.check_buffers(self.model, "molmo")

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.embedding_size or self.model.config.vocab_size)

    def image_geometry(self):
        # the most crops the processor cuts (and the whole image once more), each pooled to its token grid plus
        # one column token per row; the vision backbone is fixed in the checkpoint's code (CLIP ViT-L/14, 336 px)
        images = self.processor.image_processor
        crops = getattr(images, "max_crops", 12) + 1
        rows, columns = getattr(images, "image_token_length_h", 12), getattr(images, "image_token_length_w", 12)
        backbone = getattr(self.model.config, "vision_backbone", None)
        size = getattr(images, "base_image_input_size", (336, 336))
        patch = getattr(images, "image_patch_size", 14)
        return {"image_tokens": crops * rows * (columns + 1) + 2,
                "vision_tokens": crops * ((size[0] // patch) * (size[1] // patch) + 1),
                "vision_layers": getattr(backbone, "image_num_layers", 24),
                "vision_hidden": getattr(backbone, "image_emb_dim", 1024)}

    def _inputs(self, image_path, question) -> dict:
        inputs = self.processor.process(images=[base._open_rgb(image_path)], text=question)
        batch = {key: value.to(self.device).unsqueeze(0) for key, value in inputs.items()}
        batch["images"] = batch["images"].to(self.model.dtype)  # float32 pixels meet bf16 weights
        return batch

    def prompt_ids(self, image_path, question) -> list[int]:
        """The processor's ids: BOS (``<|endoftext|>``), the image tokens, then `` User: {question} Assistant:``."""
        return self.processor.process(images=[base._open_rgb(image_path)], text=question)["input_ids"].tolist()

    def prompt_text(self, image_path, question):
        return self.tokenizer.decode(self.prompt_ids(image_path, question))

    def logits(self, image_path, question):
        import torch

        with torch.inference_mode():
            return self.model(**self._inputs(image_path, question)).logits[0, -1].float().cpu()

    # batches: BOS and the image tokens come first; the forward with the image keeps its cache (a tuple per
    # layer, batch first), then the questions' own tokens run on it with explicit positions and mask
    def batch_inputs(self, image_path, questions):
        """The image is processed once (its crops, resized on the host, serve every question): the processor puts
        the image first and the question's text tokens after it, so each question's ids are the first one's image
        part and then its own text tokens, which the processor's tokenizing step gives. Checked on the first
        question against the processor's whole output; where they differ, every question is processed whole."""
        image = base._open_rgb(image_path)
        first = self.processor.process(images=[image], text=questions[0])
        ids = first["input_ids"].tolist()
        own = self._text_tokens(questions[0]) or []
        cut = len(ids) - len(own)
        image_part = ids[:cut]  # BOS and the image's tokens alone, where the split holds
        if not (own and 0 < cut and ids[cut:] == own
                and set(image_part[1:]) <= set(getattr(self.processor, "special_token_ids", {}).values())):
            if not getattr(self, "_said_whole", False):
                print("molmo: this processor's text tokens could not be split from the image's; each question of an"
                      " image is processed whole (its crops made again)", file=sys.stderr, flush=True)
                self._said_whole = True
            processed = [self.processor.process(images=[image], text=question) for question in questions[1:]]
            return [ids] + [inputs["input_ids"].tolist() for inputs in processed], first
        return [ids] + [image_part + self._text_tokens(question) for question in questions[1:]], first

    def _text_tokens(self, question) -> list[int] | None:
        """The question's text tokens as ``processor.process`` makes them (its message format and leading space,
        from the processor's own defaults), or None where this revision's processor has no such step."""
        if "_text_kwargs" not in vars(self):
            kwargs_class = getattr(sys.modules.get(type(self.processor).__module__), "MolmoProcessorKwargs", None)
            try:
                self._text_kwargs = self.processor._merge_kwargs(
                    kwargs_class, tokenizer_init_kwargs=self.tokenizer.init_kwargs)["text_kwargs"]
            except (AttributeError, KeyError, TypeError):
                self._text_kwargs = None
        if self._text_kwargs is None or not hasattr(self.processor, "get_tokens_input"):
            return None
        return list(self.processor.get_tokens_input(question, self._text_kwargs.get("message_format"),
                                                    self._text_kwargs.get("always_start_with_space")))

    def image_end(self, ids, state):
        return int(state["image_input_idx"].max()) + 1

    def prefix_cache(self, ids, state):
        import torch

        batch = {key: value.to(self.device).unsqueeze(0) for key, value in state.items()}
        batch["input_ids"] = torch.tensor([ids], device=self.device)
        batch["images"] = batch["images"].to(self.model.dtype)
        return self.model(**batch, use_cache=True).past_key_values

    def suffix_logits(self, rows, past):
        import torch

        ids, mask, lengths = base.pad_rows(rows, -1)
        done = past[0][0].shape[-2]
        mask = torch.cat([torch.ones((len(rows), done), dtype=mask.dtype), mask], dim=1)
        positions = torch.arange(done, done + ids.shape[1]).expand(len(rows), -1)
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                            position_ids=positions.to(self.device), past_key_values=base.expand_cache(past, len(rows)),
                            use_cache=True).logits
        return logits[torch.arange(len(rows)), lengths - 1]

    def decode_group(self, image_path, question):
        return image_path  # rows of one image: the same crops, no image padding

    def decode_batch(self, items, max_new_tokens, num_beams, repetition_penalty, sampling):
        """``generate_from_batch`` as built for batches: ids right-padded with -1, the last real logits first."""
        import torch

        self._refuse_decoding(num_beams)
        ids, state = self.batch_inputs(items[0][0], [question for _, question in items])
        batch = {key: value.to(self.device).unsqueeze(0).expand(len(items), *value.shape).contiguous()
                 for key, value in state.items() if key != "input_ids"}
        batch["images"] = batch["images"].to(self.model.dtype)
        batch["input_ids"] = base.pad_rows(ids, -1)[0].to(self.device)
        with torch.inference_mode():
            output = self.model.generate_from_batch(batch, self._generation_config(max_new_tokens, repetition_penalty,
                                                                                   sampling), tokenizer=self.tokenizer)
        return [self._answer(output[i, batch["input_ids"].shape[1]:].tolist()) for i in range(len(items))]

    def _answer(self, new: list[int]) -> tuple[str, list[int]]:
        new = base.trim_after_end(new, set(self.stop_ids()))
        return self.tokenizer.decode(new, skip_special_tokens=True).strip(), new

    def _refuse_decoding(self, num_beams):
        if int(num_beams) != 1:  # its caches are plain tuples and the class has no _reorder_cache for beams
            raise ValueError("molmo: generate_from_batch cannot run beam search (num_beams=1 only)")
        if base._transformers_major() >= 5:
            raise NotImplementedError("molmo: generate_from_batch does not run on transformers 5.x; decode text in "
                                      "its worker env (env: remote-molmo); scores from logits work here")

    def _generation_config(self, max_new_tokens, repetition_penalty, sampling):
        """The model card's settings; its stop string ``<|endoftext|>`` is one token, stopped at by id (the same
        stop; transformers' stop-string check embeds the ids before a row's new tokens, and batches pad with -1)."""
        from transformers import GenerationConfig

        end = self.tokenizer.convert_tokens_to_ids("<|endoftext|>")
        return GenerationConfig(max_new_tokens=int(max_new_tokens), eos_token_id=end, pad_token_id=end,
                                use_cache=True, repetition_penalty=float(repetition_penalty),
                                **base.generation_settings(sampling))

    def generate(self, image_path, question, max_new_tokens, num_beams=1, repetition_penalty=1.0, sampling=None):
        import torch

        self._refuse_decoding(num_beams)
        tag = base.sampling_tag(num_beams, repetition_penalty, sampling)
        inputs = self._inputs(image_path, question)
        config = self._generation_config(max_new_tokens, repetition_penalty, sampling)
        with torch.inference_mode():
            output = self.model.generate_from_batch(inputs, config, tokenizer=self.tokenizer)
        text, self.last_token_ids = self._answer(output[0, inputs["input_ids"].shape[1]:].tolist())
        return text, tag


DRIVERS: dict[str, type[base.Driver]] = {
    "qwen_vl_chat": QwenVLChatDriver,
    "molmo": MolmoDriver,
    "minicpm_v": MiniCPMVDriver,
    "mplug_owl2": MplugOwl2Driver,
}
