"""Drivers of the paper's two remote-code checkpoints on a Llama language model (MiniCPM-Llama3-V-2.5,
mPLUG-Owl2), each with its load-time patches for transformers 5.x; the table of every driver is
:data:`remote_drivers.DRIVERS`.

Stdlib only at import, like :mod:`remote_worker`, which hosts them (in-process, or in a worker process in
the checkpoint's own environment without the package installed).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

if __package__:  # imported as verbmirage.models.remote_drivers_llama
    from verbmirage.models import remote_driver as base
else:  # beside remote_worker.py in a remote-code environment (this folder on sys.path)
    import remote_driver as base  # type: ignore[no-redef]


# ---- MiniCPM-Llama3-V-2.5 ---------------------------------------------------------------------------
def patch_minicpm_after_load(model) -> None:
    """Recompute the resampler's 2-D sin-cos table, a non-persistent buffer that 5.x leaves uninitialised."""
    resampler = model.resampler
    resampler._set_2d_pos_cache(resampler.max_size, device=next(resampler.parameters()).device)


def supply_list_to_torch_functional() -> bool:
    """MiniCPM's ``resampler.py`` gets ``List`` from ``from torch.nn.functional import *``.

    torch 2.1 imported ``List`` there; later releases do not, and the import of
    the checkpoint code fails with NameError. ``torch.nn.functional`` has no
    ``__all__``, so giving it ``List`` back restores the star import.
    """
    import typing

    import torch.nn.functional as functional

    if hasattr(functional, "List"):
        return False
    functional.List = typing.List
    return True


class MiniCPMVDriver(base.Driver):
    """openbmb/MiniCPM-Llama3-V-2_5: its processor (loaded once), vision embedding, then the LLM on ``inputs_embeds``."""

    name = "minicpm_v"

    def load(self):
        from transformers import AutoModel, AutoProcessor, AutoTokenizer

        load = {"trust_remote_code": True, "revision": self.revision}
        supply_list_to_torch_functional()
        if base._transformers_major() >= 5:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            model_class = get_class_from_dynamic_module("modeling_minicpmv.MiniCPMV", self.path, revision=self.revision)
            if not hasattr(model_class, "all_tied_weights_keys"):
                model_class.all_tied_weights_keys = {}  # no post_init(); embeddings are not tied
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, **load)
        self.processor = AutoProcessor.from_pretrained(self.path, **load)  # once, pinned, passed to chat()
        self.model = AutoModel.from_pretrained(self.path, **{base._dtype_kwarg(): self.dtype}, **load)
        self.model = self.model.to(self.device).eval()
        if base._transformers_major() >= 5:
            patch_minicpm_after_load(self.model)
            base.check_buffers(self.model, "minicpm_v")

    @property
    def vocab_size(self) -> int:
        return int(self.model.llm.lm_head.weight.shape[0])

    def image_geometry(self):
        # the most slices its processor cuts (and the whole image once more), each resampled to ``query_num``
        # tokens between two markers; each slice's patches run through the vision tower
        config = self.model.config
        slices = (config.slice_config.max_slice_nums if config.slice_mode else 0) + 1
        vision = config.vision_config
        return {"image_tokens": slices * (config.query_num + 2),
                "vision_tokens": slices * (config.image_size // config.patch_size) ** 2,
                "vision_layers": vision.num_hidden_layers, "vision_hidden": vision.hidden_size}

    def _chat_messages(self, question: str) -> list[dict]:
        """What ``chat()`` builds from ``msgs=[{"role": "user", "content": question}]`` and an image: image first."""
        return [{"role": "user", "content": "(<image>./</image>)\n" + question}]

    def prompt_text(self, image_path, question):
        """``chat()``'s prompt: the Llama-3 template over its messages, generation header appended."""
        return self.processor.tokenizer.apply_chat_template(self._chat_messages(question), tokenize=False,
                                                            add_generation_prompt=True)

    def _inputs(self, image_path, question):
        """``chat()``'s processor call (slices, placeholders, image bounds), pixels on the model's device."""
        inputs = self.processor(self.prompt_text(image_path, question), [base._open_rgb(image_path)], return_tensors="pt",
                                max_length=2048).to(self.device)
        inputs["pixel_values"] = [[p.to(self.device) for p in row] for row in inputs["pixel_values"]]
        return inputs

    def prompt_ids(self, image_path, question) -> list[int]:
        return self._inputs(image_path, question)["input_ids"][0].tolist()

    def logits(self, image_path, question):
        """The model's own vision embedding, then the language model on ``inputs_embeds``."""
        import torch

        with torch.inference_mode():
            embeddings, _ = self.model.get_vllm_embedding(self._inputs(image_path, question))
            return self.model.llm(inputs_embeds=embeddings).logits[0, -1].float().cpu()

    def generate(self, image_path, question, max_new_tokens, num_beams=1, repetition_penalty=1.0, sampling=None):
        """``chat(sampling=False)``'s path with the beam count and penalty explicit (its default is beam3-rp1.2, C1)."""
        import torch

        tag = base.sampling_tag(num_beams, repetition_penalty, sampling)
        with torch.inference_mode():
            output = self.model.generate(self._inputs(image_path, question), tokenizer=self.tokenizer,
                                         max_new_tokens=int(max_new_tokens), num_beams=int(num_beams),
                                         repetition_penalty=float(repetition_penalty), decode_text=False,
                                         **base.generation_settings(sampling))
        self.last_token_ids = output[0].tolist()
        return self.model._decode_text(output, self.tokenizer)[0], tag

    # batches: the processor's own steps (image slices once per image, then each question's text with the
    # slice placeholders); the vision embedding runs on the shared ids, the LLM's cache (tuples) is reused
    def batch_inputs(self, image_path, questions):
        pixels = self.processor.image_processor([base._open_rgb(image_path)], do_pad=True, return_tensors="pt")
        inputs = [self.processor._convert_images_texts_to_inputs(pixels, self.prompt_text(image_path, question),
                                                                 max_length=2048) for question in questions]
        return [row["input_ids"][0].tolist() for row in inputs], inputs[0]

    def image_end(self, ids, state):
        return int(state["image_bound"][0][:, 1].max()) + 1

    def prefix_cache(self, ids, state):
        import torch

        inputs = dict(state.to(self.device))
        inputs["input_ids"] = torch.tensor([ids], dtype=state["input_ids"].dtype, device=self.device)
        inputs["pixel_values"] = [[p.to(self.device) for p in row] for row in state["pixel_values"]]
        embeddings, _ = self.model.get_vllm_embedding(inputs)
        return self.model.llm(inputs_embeds=embeddings, use_cache=True).past_key_values

    def suffix_logits(self, rows, past):
        import torch

        ids, _, lengths = base.pad_rows(rows, 0)
        embeddings = self.model.llm.model.embed_tokens(ids.to(self.device))
        if hasattr(self.model.llm.config, "scale_emb"):  # as get_vllm_embedding
            embeddings = embeddings * self.model.llm.config.scale_emb
        logits = self.model.llm(inputs_embeds=embeddings, past_key_values=base.expand_cache(past, len(rows)),
                                use_cache=True).logits
        return logits[torch.arange(len(rows)), lengths - 1]

    def decode_batch(self, items, max_new_tokens, num_beams, repetition_penalty, sampling):
        """The model's ``generate`` on a batch: ids left-padded (id 0, masked; the image bounds shifted with them),
        pixel slices per row, the attention mask handed on to the LLM's ``generate``."""
        import torch

        inputs = [self._inputs(image, question) for image, question in items]
        rows = [row["input_ids"][0].tolist() for row in inputs]
        ids, mask, lengths = base.pad_rows(rows, 0, left=True)
        shifts = ids.shape[1] - lengths
        batch = {"input_ids": ids.to(self.device), "pixel_values": [row["pixel_values"][0] for row in inputs],
                 "tgt_sizes": [row["tgt_sizes"][0] for row in inputs],
                 "image_bound": [row["image_bound"][0] + int(shift) for row, shift in zip(inputs, shifts)]}
        with torch.inference_mode():
            output = self.model.generate(batch, tokenizer=self.tokenizer, max_new_tokens=max_new_tokens,
                                         num_beams=num_beams, repetition_penalty=repetition_penalty,
                                         decode_text=False, attention_mask=mask.to(self.device),
                                         **base.generation_settings(sampling))
        ends = set(self.stop_ids()) | {self.tokenizer.convert_tokens_to_ids("<|eot_id|>")}
        out = []
        for row in output:
            new = base.trim_after_end(row.tolist(), ends)
            out.append((self.model._decode_text(row[: len(new)].unsqueeze(0), self.tokenizer)[0], new))
        return out

    def reference_text(self, image_path, question, max_new_tokens, num_beams=1):
        """The checkpoint's own ``chat()`` (sampling off), with the processor loaded once."""
        return self.model.chat(image=base._open_rgb(image_path), msgs=[{"role": "user", "content": question}],
                               tokenizer=self.tokenizer, processor=self.processor, sampling=False,
                               max_new_tokens=int(max_new_tokens), num_beams=int(num_beams), repetition_penalty=1.0)


# ---- mPLUG-Owl2 ---------------------------------------------------------------------------------------
def import_mplug_owl2(code_dir: str | None = None):
    """The ``mplug_owl2`` package, from ``code_dir`` (a checkout of X-PLUG/mPLUG-Owl's ``mPLUG-Owl2/``) if given.

    An ImportError raised inside the package (a missing ``icecream``, or
    transformers >= 4.3x without the 4.31 internals it patches) propagates as
    itself: it says what is wrong, which "install the package" would not.
    """
    if code_dir:
        folder = Path(code_dir).resolve()
        if not (folder / "mplug_owl2" / "__init__.py").is_file():
            raise FileNotFoundError(f"code_dir {folder}: no mplug_owl2/__init__.py (give the mPLUG-Owl2/ folder)")
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("mplug_owl2")
    except ModuleNotFoundError as error:
        if error.name != "mplug_owl2":
            raise
        raise ModuleNotFoundError(
            "the mplug_owl2 package is not importable in this environment "
            f"({sys.executable}): set the driver option code_dir to a checkout of X-PLUG/mPLUG-Owl's mPLUG-Owl2/ "
            "folder, or pip install it with --no-deps into the env built from envs/remote-mplug_owl2.txt",
            name="mplug_owl2",
        ) from error


class MplugOwl2Driver(base.Driver):
    """MAGAer13/mplug-owl2-llama2-7b through the ``mplug_owl2`` package (needs transformers 4.31: own env).

    Loads as the package's ``load_pretrained_model`` does for a full checkpoint
    (slow LLaMA tokenizer, the registered causal-LM class, CLIP image processor),
    except that the dtype asked for is honoured (the builder forces float16) and
    a hub id is fetched at the pinned ``revision``. Prompts come from the
    package's ``conv_templates["mplug_owl2"]`` and ``tokenizer_image_token``
    (the image as id -200, embedded by the model's own multimodal preparation).
    """

    name = "mplug_owl2"

    def load(self):
        import torch  # noqa: F401  (imported before the package, which expects it)

        import_mplug_owl2(self.options.get("code_dir"))
        from mplug_owl2.model import MPLUGOwl2LlamaForCausalLM  # noqa: F401  (registers the config with Auto*)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.models.clip.image_processing_clip import CLIPImageProcessor

        folder = self._local_folder()
        self.tokenizer = AutoTokenizer.from_pretrained(folder, use_fast=False)
        # As the builder: weights straight onto the one device (device_map needs accelerate, which the env has).
        self.model = AutoModelForCausalLM.from_pretrained(folder, low_cpu_mem_usage=True, torch_dtype=self.dtype,
                                                          device_map={"": self.device}).eval()
        self.image_processor = CLIPImageProcessor.from_pretrained(folder)

    def image_geometry(self):
        # the visual abstractor's learned queries (and one more token) in the sequence; CLIP's patches before
        visual = self.model.config.visual_config
        model, abstractor = visual.get("visual_model", {}), visual.get("visual_abstractor", {})
        return {"image_tokens": abstractor.get("num_learnable_queries", 64) + 1,
                "vision_tokens": (model.get("image_size", 448) // model.get("patch_size", 14)) ** 2 + 1,
                "vision_layers": model.get("num_hidden_layers", 24), "vision_hidden": model.get("hidden_size", 1024)}

    def _local_folder(self) -> str:
        """The checkpoint folder: ``path`` itself, or the hub snapshot at ``revision`` (the revision is used)."""
        if Path(self.path).is_dir():
            return self.path
        from huggingface_hub import snapshot_download

        return snapshot_download(self.path, revision=self.revision)

    def prompt_text(self, image_path, question):
        from mplug_owl2.constants import DEFAULT_IMAGE_TOKEN
        from mplug_owl2.conversation import conv_templates

        conversation = conv_templates["mplug_owl2"].copy()
        conversation.append_message(conversation.roles[0], DEFAULT_IMAGE_TOKEN + question)
        conversation.append_message(conversation.roles[1], None)
        return conversation.get_prompt()

    def prompt_ids(self, image_path, question) -> list[int]:
        """The prompt's ids with the image as ``IMAGE_TOKEN_INDEX`` (-200), one BOS first."""
        from mplug_owl2.constants import IMAGE_TOKEN_INDEX
        from mplug_owl2.mm_utils import tokenizer_image_token

        return tokenizer_image_token(self.prompt_text(image_path, question), self.tokenizer, IMAGE_TOKEN_INDEX)

    def _inputs(self, image_path, question):
        import torch
        from mplug_owl2.mm_utils import process_images

        ids = torch.tensor([self.prompt_ids(image_path, question)], device=self.device)
        pixels = process_images([base._open_rgb(image_path)], self.image_processor)
        return ids, pixels.to(self.device, dtype=self.model.dtype)  # the weights' dtype, whatever was asked

    def logits(self, image_path, question):
        import torch

        ids, pixels = self._inputs(image_path, question)
        with torch.inference_mode():
            return self.model(input_ids=ids, images=pixels).logits[0, -1].float().cpu()

    def generate(self, image_path, question, max_new_tokens, num_beams=1, repetition_penalty=1.0, sampling=None):
        """Decoding as the official evaluations run it (``do_sample=False``, O6, unless sampling is asked),
        stopping at ``</s>``."""
        import torch

        tag = base.sampling_tag(num_beams, repetition_penalty, sampling)
        ids, pixels = self._inputs(image_path, question)
        with torch.inference_mode():
            output = self.model.generate(
                ids, images=pixels, num_beams=int(num_beams), repetition_penalty=float(repetition_penalty),
                max_new_tokens=int(max_new_tokens), use_cache=True, pad_token_id=self.tokenizer.eos_token_id,
                **base.generation_settings(sampling),
            )
        text, self.last_token_ids = self._answer(output[0, ids.shape[1]:].tolist())
        return text, tag

    # batches: BOS, ``USER: `` and the image run once through the model's multimodal forward (its cache is a
    # tuple per layer, batch first); the questions' own tokens are text, run on that cache with images=None
    def batch_inputs(self, image_path, questions):
        from mplug_owl2.mm_utils import process_images

        pixels = process_images([base._open_rgb(image_path)], self.image_processor)
        return [self.prompt_ids(image_path, question) for question in questions], pixels

    def image_end(self, ids, state):
        from mplug_owl2.constants import IMAGE_TOKEN_INDEX

        return ids.index(IMAGE_TOKEN_INDEX) + 1

    def prefix_cache(self, ids, state):
        import torch

        return self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True,
                          images=state.to(self.device, dtype=self.model.dtype)).past_key_values

    def suffix_logits(self, rows, past):
        import torch

        ids, _, lengths = base.pad_rows(rows, self.tokenizer.eos_token_id)
        logits = self.model(input_ids=ids.to(self.device), past_key_values=base.expand_cache(past, len(rows)),
                            use_cache=True).logits
        return logits[torch.arange(len(rows)), lengths - 1]

    def decode_group(self, image_path, question):
        """Prompts of one length: the package's multimodal preparation pads on the right and its later steps
        reset the attention mask, so padded rows would not answer as alone; equal lengths need no padding."""
        return len(self.prompt_ids(image_path, question))

    def decode_batch(self, items, max_new_tokens, num_beams, repetition_penalty, sampling):
        import torch

        inputs = [self._inputs(image, question) for image, question in items]
        ids = torch.cat([row[0] for row in inputs])
        pixels = torch.cat([row[1] for row in inputs])
        with torch.inference_mode():
            output = self.model.generate(
                ids, images=pixels, num_beams=num_beams, repetition_penalty=repetition_penalty,
                max_new_tokens=max_new_tokens, use_cache=True, pad_token_id=self.tokenizer.eos_token_id,
                **base.generation_settings(sampling),
            )
        return [self._answer(output[i, ids.shape[1]:].tolist()) for i in range(len(items))]

    def _answer(self, new: list[int]) -> tuple[str, list[int]]:
        new = base.trim_after_end(new, set(self.stop_ids()))
        return self.tokenizer.decode(new, skip_special_tokens=True).strip(), new

    def reference_text(self, image_path, question, max_new_tokens, num_beams=1):
        """The package README's inference (its stopping criterion and decode), sampling switched off."""
        import torch
        from mplug_owl2.mm_utils import KeywordsStoppingCriteria

        ids, pixels = self._inputs(image_path, question)
        from mplug_owl2.conversation import conv_templates

        # the README's keyword criterion handles one sequence only; beams end at </s> (the generation config)
        stop = [KeywordsStoppingCriteria([conv_templates["mplug_owl2"].sep2], self.tokenizer, ids)] \
            if int(num_beams) == 1 else []
        with torch.inference_mode():
            output = self.model.generate(ids, images=pixels, do_sample=False, max_new_tokens=int(max_new_tokens),
                                         use_cache=True, stopping_criteria=stop, num_beams=int(num_beams))
        return self.tokenizer.decode(output[0, ids.shape[1]:]).strip()
