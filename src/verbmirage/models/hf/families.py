"""Model families on the transformers engine: what LLaVA-1.5, InstructBLIP and Qwen2-VL / Qwen2.5-VL do
differently from any ``AutoModelForImageTextToText`` checkpoint (:class:`~.engine.TransformersVLM`).

A family declares its differences as class attributes; where its rendering and encoding differ it names a subclass
of the engine's :class:`~.inputs.PromptInputs` (``inputs_class``), where its forward after a cached prefix differs
one of :class:`~.prefix_cache.PrefixCache` (``prefix_cache_class``); loading and the whole-prompt step stay
methods of the family.
"""

from __future__ import annotations

import inspect
import logging

import torch

from verbmirage.models.hf.engine import TransformersVLM
from verbmirage.models.hf.inputs import PromptInputs
from verbmirage.models.hf.prefix_cache import PrefixCache
from verbmirage.models.hf.tokens import images_only_processor
from verbmirage.models.prompts import CHAT_TEMPLATE, CONVERSATIONS

log = logging.getLogger(__name__)


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


class InstructBlipInputs(PromptInputs):
    """InstructBLIP's prompts: the bare instruction, encoded by the processor for every prompt (its Q-Former reads
    the text, so no encoding is shared)."""

    def render_turn(self, text: str) -> str:
        """InstructBLIP takes the bare instruction (its processor prepends the query tokens)."""
        return text

    def encode(self, texts, images, padding_side: str = "right", on_host: bool = False):
        self.engine.processor.qformer_tokenizer.padding_side = "right"  # the Q-Former reads the text bidirectionally
        return super().encode(texts, images, padding_side, on_host)

    def encode_shared_image(self, texts, image):
        return self.encode(texts, [image] * len(texts))


class InstructBlipVLM(TransformersVLM):
    """InstructBLIP: its Q-Former reads the question, so no prefix can be shared; batched full forwards."""

    backend = "instructblip"
    supports_prefix_reuse = False
    model_class = "InstructBlipForConditionalGeneration"
    inputs_class = InstructBlipInputs

    def step_forward(self, input_ids, attention_mask, cache, state=None):
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


class QwenInputs(PromptInputs):
    """Qwen's image tensors: flattened patches plus a grid per image."""

    def _image_inputs(self, first, rows):
        """Qwen stores an image as flattened patches plus its grid: one copy of both per row."""
        return {"pixel_values": first["pixel_values"].repeat(rows, 1),
                "image_grid_thw": first["image_grid_thw"].repeat(rows, 1)}


class QwenPrefixes(PrefixCache):
    """Qwen's prefixes: the prefix pass takes one image's patches, and the text after a prefix takes M-RoPE
    positions offset by the image's rope delta (kept with the prefix)."""

    def _prefix_inputs(self, prefix_ids, encoded):
        patches = int(encoded["image_grid_thw"][0].prod())
        return {
            "input_ids": prefix_ids[None],
            "attention_mask": torch.ones_like(prefix_ids)[None],
            "pixel_values": encoded["pixel_values"][:patches],
            "image_grid_thw": encoded["image_grid_thw"][:1],
            "mm_token_type_ids": (prefix_ids == self.engine.image_token_id()).long()[None],
        }

    def _prefix_extra(self):
        """The image's M-RoPE offset, which the text after it needs (set by the prefix pass just run)."""
        return self.engine.model.model.rope_deltas.clone()

    def suffix_forward(self, input_ids, attention_mask, cache, slots, positions=None, extra=None, keep=0):
        """Text after the image: position = index + the image's rope delta (``extra``), on all three M-RoPE
        axes."""
        rope_delta = extra.to(self.engine.device)
        text = slots[None].expand(input_ids.shape[0], -1) if positions is None else positions
        position_ids = (text + rope_delta).expand(3, -1, -1)
        return self.engine.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            cache_position=slots, use_cache=True, logits_to_keep=keep, **{self.engine.cache_argument: cache},
        ).logits


class QwenVLM(TransformersVLM):
    """Qwen2-VL and Qwen2.5-VL: M-RoPE positions, images as flattened patches with a grid per image."""

    backend = "qwen2_vl"
    inputs_class = QwenInputs
    prefix_cache_class = QwenPrefixes

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

    def step_state(self):
        """The rope delta of each row of the prompt pass just run (the model keeps only the last pass's)."""
        return self.model.model.rope_deltas

    def step_forward(self, input_ids, attention_mask, cache, state=None):
        """One token after whole prompts (no prefix reuse): its M-RoPE position is the row's token count plus
        its rope delta from the prompt pass (``state``, kept with the rows as they move or leave; transformers
        would derive it from the whole mask, wrongly)."""
        delta = state.to(self.device)  # FullStepper hands every step its rows' deltas
        text = attention_mask.sum(dim=1, keepdim=True) - 1
        position_ids = (text + delta).expand(3, -1, -1)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **{self.cache_argument: cache}).logits
