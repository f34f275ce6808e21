"""Prompts and processor inputs of the transformers engine: the chat frame a prompt is rendered in, and the
encoding of an image's prompts (the image preprocessed once, the prompts tokenized as text and their image
placeholder expanded as the processor would).

:class:`PromptInputs` is a collaborator of :class:`~verbmirage.models.hf.engine.TransformersVLM` (its ``inputs``;
a family that renders or encodes differently names a subclass in ``inputs_class``). It reads of the engine only
what :class:`InputsHost` declares. It owns the caches that outlive one call, and only it:

- ``_opened``: the images of the current call by path (a decoding that follows its scoring call reuses the same
  image objects, so their encodings below are found by identity);
- ``_encoded_images``: per image object (by id) its one-prompt processor encoding and image token count
  (:meth:`PromptInputs.encode_shared_image`), kept for the images of the current call only;
- ``_kept_text_ids``: prompt text -> token ids (:meth:`PromptInputs.text_ids`): prompts repeat across images;
- ``_frame``: the chat template's frame around a turn's text (:meth:`PromptInputs._chat_frame`).

Each is a cache: dropping it (:meth:`PromptInputs.forget`) changes no result, only the time to the next one.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from verbmirage.core.imaging import expand_to_square, square_input_side
from verbmirage.models.base import Question
from verbmirage.models.prompts import CHAT_TEMPLATE, CONVERSATIONS, PromptTemplate

#: Encoding keys that hold one value per token (the rest are image tensors).
PER_TOKEN_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


def by_image(items: list[tuple]) -> dict[Path, list[int]]:
    """The indices of ``items`` ((image path, image, prompt text)) per image path, in order."""
    groups: dict[Path, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(item[0], []).append(index)
    return groups


class InputsHost(Protocol):
    """What :class:`PromptInputs` needs of its engine (:class:`~verbmirage.models.hf.engine.TransformersVLM`)."""

    processor: Any
    tokenizer: Any
    device: torch.device
    prompts: PromptTemplate
    conversation: str
    image_mode: str
    shipped_mode: str  # the processor as shipped (the first image mode)
    PREFIX_SLOTS: int

    def image_token_id(self) -> int | None: ...
    def open_image(self, path: Path) -> Image.Image: ...


class PromptInputs:
    """Rendering and encoding, and the images and encodings of the current call (the engine's ``inputs``)."""

    def __init__(self, engine: InputsHost):
        self.engine = engine
        self._opened: dict[Path, Image.Image] = {}
        self._encoded_images: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self._kept_text_ids: dict[str, list[int]] = {}
        self._frame: tuple[str, str] | None | bool = False  # False: not found yet

    def forget(self) -> None:
        """Drop the image encodings and the opened images (benchmarks start cold; out of memory frees them)."""
        self._encoded_images.clear()
        self._opened = {}

    def open_items(self, questions: list[Question], texts: list[str], new_call: bool = False) -> tuple[list, list]:
        """Per question: an error (its image does not open) or the item (image path, image, prompt text).

        ``new_call`` (scoring; decodings follow it on a subset of its questions): from now on only these
        images keep their encoding (and, the engine's side, their prefix: a 7B model's prefix is ~0.3 GB).
        """
        images: dict[Path, Image.Image | str] = {}
        errors: list[str | None] = [None] * len(questions)
        items: list[tuple | None] = [None] * len(questions)
        for index, (question, text) in enumerate(zip(questions, texts)):
            if question.image not in images:
                images[question.image] = self._opened.get(question.image)
                if images[question.image] is None:
                    try:
                        images[question.image] = self.engine.open_image(question.image)
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
            self._opened = dict(list(self._opened.items())[-self.engine.PREFIX_SLOTS:])
            return errors, items
        self._opened = opened
        kept = {id(image) for image in self._opened.values()}
        for key in [key for key in self._encoded_images if key not in kept]:
            del self._encoded_images[key]
        return errors, items

    def opened_paths(self) -> set[Path]:
        """The image paths of the current call."""
        return set(self._opened)

    def render(self, question: Question, multiple_choice: bool | None) -> str:
        """The full prompt text, image placeholder included: the one rendering of scoring and generation.

        ``multiple_choice`` None is free text (``generate``): the question as it is, no answer instruction.
        """
        prompts = self.engine.prompts
        text = question.prompt if multiple_choice is None else prompts.render(question.prompt, multiple_choice)
        return self.render_turn(text)

    def render_turn(self, text: str) -> str:
        """One user turn (the image, then ``text``) and the opening of the answer, in the configured format."""
        if self.engine.conversation != CHAT_TEMPLATE:
            return CONVERSATIONS[self.engine.conversation].render(text, self.engine.processor.image_token)
        frame = self._chat_frame()
        if frame is not None and text == text.strip():
            return frame[0] + text + frame[1]
        return self._chat_turn(text)

    def _chat_turn(self, text: str) -> str:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        return self.engine.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    #: Texts rendered to find the chat template's frame (sentence case, punctuation, a line break: as questions)
    FRAME_PROBES = ("Is someone probing the frame?\nAnswer yes or no.", "Which one? A. first\nB. second")

    def _chat_frame(self) -> tuple[str, str] | None:
        """The text the chat template puts before and after a turn's text, so that rendering a prompt is a
        concatenation (Jinja costs ~0.1 ms per prompt, twice per decoded question). Found from two probe texts;
        None, and every prompt goes through the template, when the template changes them or frames them
        differently. Texts with surrounding white space always go through it (templates often trim)."""
        if self._frame is False:
            frames = set()
            for probe in self.FRAME_PROBES:
                rendered = self._chat_turn(probe)
                frames.add(tuple(rendered.split(probe)) if rendered.count(probe) == 1 else None)
            self._frame = frames.pop() if len(frames) == 1 else None
        return self._frame

    def encode(self, texts: list[str], images: list[Image.Image], padding_side: str = "right", on_host: bool = False):
        """Processor call (each image first as :meth:`prepare_image` makes it), padded on ``padding_side``, on the
        model's device (``on_host``: left on the host)."""
        self.engine.tokenizer.padding_side = padding_side
        prepared: dict[int, Image.Image] = {}  # an image repeated for several prompts is prepared once
        images = [prepared.setdefault(id(image), self.prepare_image(image)) for image in images]
        encoded = self.engine.processor(text=texts, images=images, return_tensors="pt", padding=True)
        return encoded if on_host else encoded.to(self.engine.device)

    def prepare_image(self, image: Image.Image) -> Image.Image:
        """``image`` as the processor gets it under the engine's
        :attr:`~.engine.TransformersVLM.image_mode`: as it is (the processor as shipped),
        expanded to a square in the processor's mean colour (``pad``: the original LLaVA-1.5's ``expand2square``
        with ``image_aspect_ratio: pad``), or squashed to the processor's square input size with bicubic
        resampling (``resize``: OPERA's LLaVA processor), after which the processor's own resize and crop
        change nothing."""
        if self.engine.image_mode == self.engine.shipped_mode:
            return image
        if self.engine.image_mode == "pad":
            mean = self.engine.processor.image_processor.image_mean
            return expand_to_square(image, tuple(int(value * 255) for value in mean))
        side = square_input_side(self.engine.processor.image_processor)
        return image.resize((side, side), Image.BICUBIC)

    def encode_shared_image(self, texts: list[str], image: Image.Image) -> dict:
        """Like ``encode(texts, [image] * n)`` but the image is preprocessed once.

        The processor runs on the first prompt only, once per image object (kept for the next calls
        with the same image: scoring, decoding and VCD of an image all reuse it); the prompts are
        tokenized as text and their image placeholder is expanded to the same number of image tokens.
        If that does not reproduce the processor's tokens for the first prompt, this falls back to
        the processor for all rows.
        """
        image_token = self.engine.image_token_id()
        found = None if image_token is None else self._image_encoding(texts[0], image, image_token)
        if found is None:
            return self.encode(texts, [image] * len(texts))
        first, count = found
        input_ids, attention_mask = self._expanded_rows(self.text_ids(texts), image_token, count)
        device = self.engine.device
        encoded = {"input_ids": torch.from_numpy(input_ids).to(device),
                   "attention_mask": torch.from_numpy(attention_mask).to(device)}
        if "mm_token_type_ids" in first:  # per-token modality marks (1 = image token)
            encoded["mm_token_type_ids"] = (encoded["input_ids"] == image_token).long()
        return {**encoded, **self._image_inputs(first, len(texts))}

    def _image_encoding(self, text: str, image: Image.Image, image_token: int):
        """(the processor's one-row encoding of ``image`` with ``text``, its image token count), kept per image
        object; None where repeating the text's placeholder does not give the processor's tokens."""
        cached = self._encoded_images.get(id(image))
        if cached is None or cached[0] is not image:
            first = self.encode([text], [image])
            count = int((first["input_ids"][0] == image_token).sum())
            expanded, _ = self._expanded_rows(self.text_ids([text]), image_token, count)
            if expanded[0].tolist() != first["input_ids"][0, : int(first["attention_mask"][0].sum())].tolist():
                return None
            cached = self._encoded_images[id(image)] = (image, first, count)
            while len(self._encoded_images) > self.engine.PREFIX_SLOTS:
                self._encoded_images.popitem(last=False)
        return cached[1], cached[2]

    def prompt_ids(self, text: str, image: Image.Image) -> np.ndarray:
        """One prompt's token ids as :meth:`encode_shared_image` gives them, read on the host: where a decoding
        reads each question's image positions and length (OPERA), a copy to the device and reads back per
        question would each wait for the device."""
        image_token = self.engine.image_token_id()
        found = None if image_token is None else self._image_encoding(text, image, image_token)
        if found is None:  # the processor's own tokens, on the host
            encoded = self.encode([text], [image], on_host=True)
            return encoded["input_ids"][0].numpy()[: int(encoded["attention_mask"][0].sum())]
        return self._expanded_rows(self.text_ids([text]), image_token, found[1])[0][0]

    #: At most this many prompt texts keep their token ids (:meth:`text_ids`).
    TEXT_IDS_KEPT = 1 << 16

    def text_ids(self, texts: list[str]) -> list[list[int]]:
        """The tokenizer's ids of each text, the new ones tokenized in one call and kept: prompts repeat across
        images (a YN question is asked of many), and one call per image cost ~1 ms each in the tokenizer."""
        kept = self._kept_text_ids
        new = list(dict.fromkeys(text for text in texts if text not in kept))
        if new:
            if len(kept) + len(new) > self.TEXT_IDS_KEPT:
                kept.clear()
            kept.update(zip(new, self.engine.tokenizer(new)["input_ids"]))
        return [kept[text] for text in texts]

    def _expanded_rows(self, rows: list[list[int]], image_token: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(input ids, attention mask) of token id rows, right-padded, with each image placeholder repeated
        ``count`` times (the processor's expansion): written into one numpy array segment by segment (a tensor
        per ~600-token row cost more than the tokenizer)."""
        places = [[i for i, token in enumerate(ids) if token == image_token] for ids in rows]
        lengths = np.array([len(ids) + (count - 1) * len(found) for ids, found in zip(rows, places)])
        pad = self.engine.tokenizer.pad_token_id or 0
        input_ids = np.full((len(rows), int(lengths.max())), pad, dtype=np.int64)
        for r, (ids, found) in enumerate(zip(rows, places)):
            start = column = 0
            for place in found:  # the text before each placeholder, then its image tokens
                input_ids[r, column : column + place - start] = ids[start:place]
                column += place - start
                input_ids[r, column : column + count] = image_token
                column, start = column + count, place + 1
            input_ids[r, column : column + len(ids) - start] = ids[start:]
        attention_mask = np.arange(input_ids.shape[1])[None] < lengths[:, None]
        return input_ids, attention_mask.astype(np.int64)

    def _image_inputs(self, first, rows: int) -> dict:
        """The image tensors of a one-row encoding, repeated for ``rows`` rows (batch-first layout)."""
        return {
            key: value.expand(rows, *value.shape[1:])
            for key, value in first.items()
            if key not in PER_TOKEN_KEYS and isinstance(value, torch.Tensor)
        }
