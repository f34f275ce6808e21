"""Prompts and processor inputs of the transformers engine: the chat frame a prompt is rendered in, and the
encoding of an image's prompts (the image preprocessed once, the prompts tokenized as text and their image
placeholder expanded as the processor would).

:class:`PromptInputs` is a mixin of :class:`~verbmirage.models.hf.engine.TransformersVLM`, which provides the
processor, the tokenizer, the model and the configured ``conversation``, ``prompts`` and ``image_mode``.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from verbmirage.core.imaging import expand_to_square, open_rgb, square_input_side
from verbmirage.models.base import Question
from verbmirage.models.prompts import CHAT_TEMPLATE, CONVERSATIONS


class PromptInputs:
    """Rendering and encoding (a mixin of ``TransformersVLM``)."""

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
