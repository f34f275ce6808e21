"""LoRA fine-tuning of a transformers model entry on a question table (``derive: {method: lora_finetune}``).

The paper's own mitigation (Appendix D; docs/models.md, "Fine-tuned models (Pangea LoRA)") is LLaVA-1.5 fine-tuned with LoRA
on 60K MC + 60K YN questions built from Pangea (derived/pangea.py); the same build fine-tunes on any table in
our question schema (``questions:``, e.g. HaloQuest's training questions converted), so REVERIE- or
HaloQuest-style baselines are one entry.

Recipe (each a setting of :class:`FinetuneSettings`): peft LoRA on the language model's linear layers
(LLaVA's ``finetune_task_lora.sh``: r 128, alpha 256, dropout 0.05, q/k/v/o/gate/up/down), the paper's
lr 2e-5 and batch 64 (reached by gradient accumulation over micro-batches), 1 epoch, warmup 3%, cosine,
AdamW without weight decay, gradient norm clipped at 1.0 (the HF Trainer's default, which LLaVA runs);
bfloat16 base weights on a GPU with float32 LoRA weights (peft's adapter autocast), float32 on CPU.

- Prompts are rendered by the engine itself (``TransformersVLM.render``), so a training prompt is exactly
  the prompt the model is evaluated with; the target is the answer the engine scores (``Yes``/``No``, the
  option letter) and the end-of-sequence token. The loss covers those answer tokens only (labels -100
  elsewhere), averaged over all answer tokens of the 64 questions of a step.
- Seeded: the order of the questions (a permutation per epoch), LoRA's initialisation and dropout.
- Checkpoints every ``checkpoint_every`` steps (LoRA weights, optimizer, scheduler, RNG states, step, the
  log so far) beside the output folder, so a job killed by SLURM's time limit resumes where it stopped;
  a checkpoint of other settings, base or data is ignored (fingerprint), a damaged one is named and the one
  before it resumed. One build per output at a time (``derived.build_lock``). A tqdm bar shows the loss.

The output folder holds the adapter (``PeftModel.save_pretrained``: ``adapter_config.json`` +
``adapter_model.safetensors``) and ``train_log.parquet`` (``io.TRAIN_LOG``: step, loss, lr, tokens); Pangea
questions and their summary are built before, by rule ``training_questions`` (derived/pangea.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.benchmark.question_sets import question_kind
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.io import read_table, write_table
from verbmirage.core.paths import atomic_path, inside
from verbmirage.core.schemas import TRAIN_LOG
from verbmirage.models.base import Question
from verbmirage.models.derived import build_lock
from verbmirage.models.derived.finetune_settings import SCHEDULERS, FinetuneSettings
from verbmirage.models.registry import create_model

log = logging.getLogger(__name__)

TRAIN_LOG_FILE = "train_log.parquet"
STATE_FILE = "state.pt"
#: The checkpoint before the latest, kept until a newer one is written: a damaged latest resumes from it.
PREVIOUS_STATE_FILE = "state.previous.pt"
#: What the engine scores as the answer (``models/parsing.py`` reads either case).
YES_NO_TARGETS = {"yes": "Yes", "no": "No"}


# ---- examples -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """One training question: its image file, whether it is MC, its prompt and the answer to learn."""

    image: Path
    multiple_choice: bool
    prompt: str
    answer: str

    @property
    def target(self) -> str:
        """The answer text the model should produce (what the engine scores)."""
        return self.answer if self.multiple_choice else YES_NO_TARGETS[self.answer]


def read_examples(questions: str | Path, images: str | Path) -> list[Example]:
    """The rows of a question table (``io.QUESTIONS``; values checked) as examples, images under ``images``."""

    frame = read_table(questions, QUESTIONS)
    if frame.empty:
        raise ValueError(f"{questions}: no questions to train on")
    return [
        Example(inside(images, Path(images) / image, f"{questions}: image {image}"), question_kind(qset) == "mc",
                prompt, answer)
        for qset, image, prompt, answer in zip(frame.qset, frame.image, frame.prompt, frame.answer)
    ]


def _joined(prompt: str, target: str, eos: str) -> str:
    """The prompt followed by the answer as the model writes it: after a space unless the prompt ends in one
    (LLaVA's "ASSISTANT: Yes</s>"; ChatML's "assistant\\nYes<|im_end|>")."""
    gap = "" if not prompt or prompt[-1].isspace() else " "
    return f"{prompt}{gap}{target}{eos}"


def training_batch(vlm, examples: list[Example]) -> dict:
    """Model inputs of ``examples`` (right-padded) with ``labels``: the answer tokens, -100 everywhere else.

    The answer's token count is the difference of the text-only tokenizations of prompt + answer and of
    the prompt (which must be a prefix of it); in the processor's encoding (image tokens expanded) those
    are the last tokens of each row.
    """
    import torch

    eos = vlm.tokenizer.eos_token or ""
    prompts = [vlm.render(_question(example), example.multiple_choice) for example in examples]
    texts = [_joined(prompt, example.target, eos) for prompt, example in zip(prompts, examples)]
    plain_prompts = vlm.tokenizer(prompts)["input_ids"]
    plain_texts = vlm.tokenizer(texts)["input_ids"]
    answer_lengths = []
    for prompt_ids, text_ids, text in zip(plain_prompts, plain_texts, texts):
        if text_ids[: len(prompt_ids)] != prompt_ids or len(text_ids) <= len(prompt_ids):
            raise ValueError(f"the answer changes the prompt's tokens (cannot mask it cleanly): {text!r}")
        answer_lengths.append(len(text_ids) - len(prompt_ids))
    encoded = dict(vlm.encode(texts, [vlm.open_image(example.image) for example in examples], "right"))
    input_ids, attention = encoded["input_ids"], encoded["attention_mask"]
    labels = torch.full_like(input_ids, -100)
    for row, (length, text_ids) in enumerate(zip(answer_lengths, plain_texts)):
        end = int(attention[row].sum())
        answer = input_ids[row, end - length: end]
        if answer.tolist() != text_ids[-length:]:
            raise ValueError(f"the processor's tokens end differently from the tokenizer's: {texts[row]!r}")
        labels[row, end - length: end] = answer
    encoded["labels"] = labels
    return encoded


def _question(example: Example):

    return Question("train", example.prompt, example.image)


def answer_loss_sum(model, batch: dict):
    """The summed cross-entropy over the answer tokens (labels != -100) and their count."""
    import torch

    inputs = {key: value for key, value in batch.items() if key != "labels"}
    logits = model(**inputs).logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    return loss, int((targets != -100).sum())


# ---- training -------------------------------------------------------------------------------------------------
def _device_and_dtype(settings: FinetuneSettings) -> tuple[str, str]:
    import torch

    device = settings.device if settings.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = settings.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def fingerprint(settings: FinetuneSettings, base_entry: dict, questions: Path) -> str:
    """What a checkpoint must match to be resumed: the settings, the base entry and the questions' bytes."""
    digest = hashlib.blake2b(Path(questions).read_bytes(), digest_size=16).hexdigest()
    text = json.dumps({"settings": asdict(settings), "base": base_entry, "questions": digest}, sort_keys=True,
                      default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def step_examples(step: int, settings: FinetuneSettings, count: int) -> list[int]:
    """The example indices of optimizer step ``step`` (0-based): consecutive slices of a seeded permutation
    per epoch, so any step's batch is known without replaying the ones before it."""
    indices = []
    for position in range(step * settings.batch_size, (step + 1) * settings.batch_size):
        epoch, offset = divmod(position, count)
        indices.append(int(_epoch_order(settings.seed, epoch, count)[offset]))
    return indices


_ORDERS: dict = {}


def _epoch_order(seed: int, epoch: int, count: int) -> np.ndarray:
    key = (seed, epoch, count)
    if key not in _ORDERS:
        _ORDERS.clear() if len(_ORDERS) > 4 else None
        _ORDERS[key] = np.random.default_rng([seed, epoch]).permutation(count)
    return _ORDERS[key]


def total_steps(settings: FinetuneSettings, count: int) -> int:
    return settings.max_steps or max(1, math.ceil(settings.epochs * count / settings.batch_size))


def checkpoint_folder(output: str | Path) -> Path:
    """Beside the output (Snakemake removes an output folder before it reruns the job; this survives)."""
    output = Path(output)
    return output.parent / f"{output.name}.checkpoints"


def _rng_state() -> dict:
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_checkpoint(folder: Path, state: dict) -> None:
    """One file, written atomically: a checkpoint is complete or absent. The one it replaces stays (a hard link,
    no copy) as :data:`PREVIOUS_STATE_FILE` until the next, so a latest damaged afterwards leaves a good one."""
    import torch


    latest = folder / STATE_FILE
    if latest.is_file():
        with atomic_path(folder / PREVIOUS_STATE_FILE) as tmp:
            tmp.unlink()
            os.link(latest, tmp)
    with atomic_path(latest) as tmp:
        torch.save(state, tmp)


def _load_checkpoint(folder: Path, expected: str) -> dict | None:
    """The latest readable checkpoint made with ``expected`` (the fingerprint), or None: start afresh.

    A checkpoint that cannot be read (empty, cut short, not a checkpoint, objects other than tensors and plain
    data) is named in the log and removed, and the one before it is tried, as inference.PartStore does with
    a damaged part; the writes are atomic, so only outside damage makes one.
    """
    import torch

    for path in (folder / STATE_FILE, folder / PREVIOUS_STATE_FILE):
        if not path.is_file():
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain data only
            if not isinstance(state, dict) or not isinstance(state.get("step"), int):
                raise ValueError("not a checkpoint of a fine-tune (no step)")
        except Exception as error:  # noqa: BLE001 - any damage: empty, truncated, not torch's format, a payload
            before = path.name == STATE_FILE and (folder / PREVIOUS_STATE_FILE).is_file()
            fallback = "the checkpoint before it" if before else "the start"
            log.warning("%s: unreadable checkpoint (%s); removing it, training resumes from %s", path,
                        _unreadable(error), fallback)
            path.unlink(missing_ok=True)
            continue
        if state.get("fingerprint") != expected:
            log.warning("checkpoint %s is of other settings, base or questions: starting afresh", path)
            return None
        return state
    return None


def _unreadable(error: Exception) -> str:
    """Why torch could not load a checkpoint, in a line (torch's own advice to load it unsafely left out)."""
    if isinstance(error, pickle.UnpicklingError):
        return "it holds objects other than tensors and plain data; refused unread"
    text = str(error).strip()
    if not text:
        return f"{type(error).__name__}: the file is empty or cut short"
    return f"{type(error).__name__}: {text.splitlines()[0].split('. ')[0][:200]}"


def load_base(slug: str, base_entry: dict, settings: FinetuneSettings):
    """The base model as the engine loads it (same processor, prompts and chat format), in training dtype."""

    device, dtype = _device_and_dtype(settings)
    entry = {**base_entry, "dtype": dtype, "device": device}
    entry.pop("adapter", None)  # a fine-tune's base is plain (derived/__init__.py refuses an adapter there)
    entry.pop("merge_adapter", None)
    return create_model(slug, entry)


def train(slug: str, settings: FinetuneSettings, base_entry: dict, questions: Path, images: Path,
          output: Path, on_step: Callable[[int, float], None] | None = None) -> pd.DataFrame:
    """Fine-tune the base on ``questions`` into ``output`` (adapter + train log); resumes from a checkpoint.

    ``on_step(step, loss)`` is called after each optimizer step (1-based), after its checkpoint. One writer per
    output (derived.build_lock): a second fine-tune of the same output fails at once naming the first.
    """

    with build_lock(output):  # before the checkpoints are read or removed
        return _train(slug, settings, base_entry, questions, images, output, on_step)


def _train(slug: str, settings: FinetuneSettings, base_entry: dict, questions: Path, images: Path,
           output: Path, on_step: Callable[[int, float], None] | None = None) -> pd.DataFrame:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from tqdm import tqdm


    output, questions, images = Path(output), Path(questions), Path(images)
    examples = read_examples(questions, images)
    steps = total_steps(settings, len(examples))
    expected = fingerprint(settings, base_entry, questions)
    checkpoints = checkpoint_folder(output)
    state = _load_checkpoint(checkpoints, expected)

    torch.manual_seed(settings.seed)
    vlm = load_base(slug, base_entry, settings)
    target = settings.target_modules
    lora = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                      target_modules=list(target) if isinstance(target, tuple) else target)
    model = get_peft_model(vlm.model, lora)  # LoRA weights in float32 over a bfloat16 base (autocast)
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    vlm.model = model
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    warmup = math.ceil(settings.warmup_ratio * steps)
    make_schedule = getattr(transformers, SCHEDULERS[settings.scheduler])
    schedule_args = {} if settings.scheduler == "constant" else {"num_training_steps": steps}
    scheduler = make_schedule(optimizer, num_warmup_steps=warmup, **schedule_args)
    rows: list[dict] = []
    start = 0
    if state is not None:
        set_peft_model_state_dict(model, state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        rows, start = list(state["log"]), int(state["step"])
        log.info("%s: resumed at step %d of %d from %s", slug, start, steps, checkpoints)
    else:
        shutil.rmtree(checkpoints, ignore_errors=True)
    log.info("%s: %d questions, %d steps of %d (micro-batches of %d), lr %g, LoRA r=%d alpha=%g on %s",
             slug, len(examples), steps, settings.batch_size, settings.micro_batch_size, settings.learning_rate,
             settings.rank, settings.alpha, vlm.device)

    model.train()
    with tqdm(total=steps, initial=start, desc=f"finetune {slug}", unit="step") as bar:
        for step in range(start, steps):
            lr = scheduler.get_last_lr()[0]
            indices = step_examples(step, settings, len(examples))
            loss_sum, tokens = 0.0, 0
            for first in range(0, len(indices), settings.micro_batch_size):
                batch = training_batch(vlm, [examples[i] for i in indices[first: first + settings.micro_batch_size]])
                loss, count = answer_loss_sum(model, batch)
                loss.backward()
                loss_sum += float(loss.detach())
                tokens += count
            for parameter in trainable:  # the mean over every answer token of the step, not of each micro-batch
                if parameter.grad is not None:
                    parameter.grad /= max(tokens, 1)
            if settings.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(trainable, settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = loss_sum / max(tokens, 1)
            rows.append({"step": step + 1, "loss": loss_value, "lr": lr, "tokens": tokens})
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.4f}")
            if (step + 1) % settings.checkpoint_every == 0 and step + 1 < steps:
                _save_checkpoint(checkpoints, {
                    "fingerprint": expected, "step": step + 1,
                    "adapter": get_peft_model_state_dict(model, save_embedding_layers=False),
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "rng": _rng_state(), "log": rows,
                })
            if on_step is not None:
                on_step(step + 1, loss_value)

    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output), save_embedding_layers=False)  # base weights never train: LoRA tensors only
    frame = pd.DataFrame(rows, columns=["step", "loss", "lr", "tokens"])
    write_table(frame, output / TRAIN_LOG_FILE, TRAIN_LOG,
                provenance={"model": slug, "settings": asdict(settings), "questions": str(questions)})
    if not settings.keep_checkpoints:
        shutil.rmtree(checkpoints, ignore_errors=True)
    log.info("%s: adapter written to %s (final loss %.4f)", slug, output, rows[-1]["loss"] if rows else math.nan)
    return frame


def build(slug: str, settings: dict, base_entry: dict, output: Path, inputs: dict) -> None:
    """The ``lora_finetune`` method of derived/__init__.py: ``inputs`` holds ``questions`` (a question table)
    and ``images`` (the folder its image paths are relative to)."""
    parsed = FinetuneSettings.from_config(settings, f"models.{slug}.derive")
    for key in ("questions", "images"):
        if key not in inputs:
            raise ValueError(f"models.{slug}.derive: the build needs input '{key}' (got {sorted(inputs)})")
    train(slug, parsed, base_entry, Path(inputs["questions"]), Path(inputs["images"]), Path(output))
