"""Adapters for checkpoints that run their own code (``trust_remote_code``).

Qwen-VL-Chat, MiniCPM-Llama3-V2.5, mPLUG-Owl2 and Molmo do not load through
``AutoModelForImageTextToText``; each adapter below holds the few lines that
differ: how the checkpoint is loaded and how an (image, prompt) pair becomes
either first-answer-position logits (scored exactly like the transformers
backends) or a reply text (parsed; ``parse_rule`` records which). None of them
can run offline, so ``docs/models.md`` lists what each needs; the shared
plumbing (:class:`RemoteCodeVLM`) is unit-tested.

``trust_remote_code: true`` must be written in the model's own config entry:
it runs Python shipped with the checkpoint, so it is never a global default.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from PIL import Image

from verbmirage.models.base import (
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    allow_remote_code,
    open_rgb,
)
from verbmirage.models.hf import DTYPES, LogitsVLM
from verbmirage.models.parsing import parse_choice, parse_yes_no
from verbmirage.models.prompts import PromptTemplate


class RemoteCodeVLM(VisionLanguageModel):
    """Shared set-up of remote-code adapters; subclasses implement :meth:`load` and :meth:`reply`."""

    backend = ""

    def __init__(
        self,
        name: str,
        path: str,
        trust_remote_code: bool = False,
        dtype: str = "bfloat16",
        device: str = "cuda",
        prompts: dict | None = None,
        max_new_tokens: int = 8,
        revision: str | None = None,
    ):
        super().__init__(name)
        if not allow_remote_code(f"models.{name}", trust_remote_code, revision, path):
            raise ValueError(
                f"models.{name}.trust_remote_code: backend '{self.backend}' runs code shipped with the "
                "checkpoint; set `trust_remote_code: true` in this model's entry to allow it"
            )
        if dtype not in DTYPES:
            raise ValueError(f"models.{name}.dtype: '{dtype}' is not one of {sorted(DTYPES)}")
        self.path, self.revision = path, revision
        self.dtype, self.device = DTYPES[dtype], torch.device(device)
        self.prompts = PromptTemplate.from_config(prompts, where=f"models.{name}.prompts")
        self.max_new_tokens = max_new_tokens
        self.load()

    def load(self) -> None:
        raise NotImplementedError

    def reply(self, image: Image.Image, image_path: Path, prompt: str, max_new_tokens: int) -> str:
        """The model's answer text to ``prompt`` about the image."""
        raise NotImplementedError

    open_image = staticmethod(open_rgb)

    def _replies(self, questions: list[Question], multiple_choice: bool | None) -> list[tuple[str, str | None]]:
        out = []
        for question in questions:
            prompt = question.prompt if multiple_choice is None else self.prompts.render(question.prompt, multiple_choice)
            try:
                image = self.open_image(question.image)
            except (OSError, ValueError) as error:
                out.append(("", f"image {question.image}: {type(error).__name__}: {error}"))
                continue
            out.append((self.reply(image, Path(question.image), prompt, self.max_new_tokens), None))
        return out

    def _score_yes_no(self, questions):
        results = []
        for text, error in self._replies(questions, multiple_choice=False):
            if error:
                results.append(YesNoResult.failed(error))
                continue
            answer, rule = parse_yes_no(text)
            p_yes = {"yes": 1.0, "no": 0.0}.get(answer, math.nan)
            results.append(YesNoResult(p_yes, answer, text, math.nan, f"text:{rule}"))
        return results

    def _score_multiple_choice(self, questions):
        results = []
        for question, (text, error) in zip(questions, self._replies(questions, multiple_choice=True)):
            n = len(question.options)
            if error:
                results.append(MultipleChoiceResult.failed(n, error))
                continue
            letter, rule = parse_choice(text, question.options)
            probs = tuple(1.0 if letter == chr(ord("A") + i) else 0.0 for i in range(n))
            results.append(MultipleChoiceResult(probs, letter, text, math.nan, f"text:{rule}"))
        return results

    def _generate(self, questions, max_new_tokens):
        self.max_new_tokens = max_new_tokens
        return [text for text, _ in self._replies(questions, multiple_choice=None)]


class RemoteLogitsVLM(LogitsVLM, RemoteCodeVLM):
    """A remote-code adapter that can also give first-answer-position logits (:meth:`logits`)."""

    def load(self) -> None:
        self._load()
        self._find_answer_tokens()

    def _load(self) -> None:
        raise NotImplementedError

    def logits(self, image: Image.Image, image_path: Path, prompt: str) -> torch.Tensor:
        raise NotImplementedError

    @torch.inference_mode()
    def answer_logits(self, questions, multiple_choice):
        rows, errors = [], []
        vocab = None
        for question in questions:
            try:
                image = self.open_image(question.image)
            except (OSError, ValueError) as error:
                rows.append(None)
                errors.append(f"image {question.image}: {type(error).__name__}: {error}")
                continue
            row = self.logits(image, Path(question.image), self.prompts.render(question.prompt, multiple_choice))
            vocab = row.shape[-1]
            rows.append(row.float().cpu())
            errors.append(None)
        vocab = vocab or len(self.tokenizer)
        stacked = torch.stack([r if r is not None else torch.full((vocab,), math.nan) for r in rows])
        return stacked, errors

    _score_yes_no = LogitsVLM._score_yes_no
    _score_multiple_choice = LogitsVLM._score_multiple_choice


class QwenVLChat(RemoteLogitsVLM):
    """Qwen/Qwen-VL-Chat: ChatML with the image as ``Picture 1: <img>path</img>``; logits from one forward."""

    backend = "qwen_vl_chat"
    SYSTEM = "You are a helpful assistant."

    def _load(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        load = {"trust_remote_code": True, "revision": self.revision}
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, **load)
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=self.dtype, **load).to(self.device).eval()

    def _chat_text(self, image_path: Path, prompt: str) -> str:
        query = self.tokenizer.from_list_format([{"image": str(image_path)}, {"text": prompt}])
        return (f"<|im_start|>system\n{self.SYSTEM}<|im_end|>\n<|im_start|>user\n{query}<|im_end|>\n"
                "<|im_start|>assistant\n")

    def logits(self, image, image_path, prompt):
        ids = self.tokenizer(self._chat_text(image_path, prompt), return_tensors="pt").input_ids.to(self.device)
        return self.model(input_ids=ids).logits[0, -1]

    def reply(self, image, image_path, prompt, max_new_tokens):
        query = self.tokenizer.from_list_format([{"image": str(image_path)}, {"text": prompt}])
        text, _ = self.model.chat(self.tokenizer, query=query, history=None, max_new_tokens=max_new_tokens)
        return text


class MolmoVLM(RemoteLogitsVLM):
    """allenai/Molmo-7B-D: ``processor.process`` builds the inputs; logits from a forward, text from generate_from_batch."""

    backend = "molmo"

    def _load(self):
        from transformers import AutoModelForCausalLM, AutoProcessor

        load = {"trust_remote_code": True, "revision": self.revision}
        self.processor = AutoProcessor.from_pretrained(self.path, **load)
        self.tokenizer = self.processor.tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=self.dtype, **load).to(self.device).eval()

    def _inputs(self, image, prompt):
        inputs = self.processor.process(images=[image], text=prompt)
        return {k: v.to(self.device).unsqueeze(0) for k, v in inputs.items()}

    def logits(self, image, image_path, prompt):
        return self.model(**self._inputs(image, prompt)).logits[0, -1]

    def reply(self, image, image_path, prompt, max_new_tokens):
        from transformers import GenerationConfig

        inputs = self._inputs(image, prompt)
        output = self.model.generate_from_batch(
            inputs, GenerationConfig(max_new_tokens=max_new_tokens, stop_strings="<|endoftext|>"),
            tokenizer=self.tokenizer,
        )
        return self.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


class MiniCPMV(RemoteCodeVLM):
    """openbmb/MiniCPM-Llama3-V-2_5: ``model.chat`` with its image slicing; answers are parsed from text."""

    backend = "minicpm_v"

    def load(self):
        from transformers import AutoModel, AutoTokenizer

        load = {"trust_remote_code": True, "revision": self.revision}
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, **load)
        self.model = AutoModel.from_pretrained(self.path, dtype=self.dtype, **load).to(self.device).eval()

    def reply(self, image, image_path, prompt, max_new_tokens):
        return self.model.chat(image=image, msgs=[{"role": "user", "content": prompt}], tokenizer=self.tokenizer,
                               sampling=False, max_new_tokens=max_new_tokens)


class MplugOwl2(RemoteCodeVLM):
    """MAGAer13/mplug-owl2-llama2-7b through the ``mplug_owl2`` package of X-PLUG/mPLUG-Owl (install it first)."""

    backend = "mplug_owl2"

    def load(self):
        try:
            from mplug_owl2.model.builder import load_pretrained_model
        except ImportError as error:
            raise ImportError(
                f"models.{self.name}: backend 'mplug_owl2' needs the mplug_owl2 package "
                "(pip install git+https://github.com/X-PLUG/mPLUG-Owl.git#subdirectory=mPLUG-Owl2)"
            ) from error
        self.tokenizer, self.model, self.image_processor, _ = load_pretrained_model(
            self.path, None, Path(self.path).name, device=str(self.device)
        )

    def reply(self, image, image_path, prompt, max_new_tokens):
        from mplug_owl2.constants import DEFAULT_IMAGE_TOKEN, IMAGE_TOKEN_INDEX
        from mplug_owl2.conversation import conv_templates
        from mplug_owl2.mm_utils import process_images, tokenizer_image_token

        conversation = conv_templates["mplug_owl2"].copy()
        conversation.append_message(conversation.roles[0], DEFAULT_IMAGE_TOKEN + prompt)
        conversation.append_message(conversation.roles[1], None)
        ids = tokenizer_image_token(conversation.get_prompt(), self.tokenizer, IMAGE_TOKEN_INDEX, return_tensors="pt")
        pixels = process_images([image], self.image_processor).to(self.device, dtype=self.dtype)
        with torch.inference_mode():
            output = self.model.generate(ids.unsqueeze(0).to(self.device), images=pixels, do_sample=False,
                                         max_new_tokens=max_new_tokens)
        return self.tokenizer.decode(output[0, ids.shape[0] :], skip_special_tokens=True)
