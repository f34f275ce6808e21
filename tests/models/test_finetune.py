"""LoRA fine-tuning (derived/finetune.py) on the tiny LLaVA: answer-only labels, memorising a small set through
the engine's own prompts, checkpoints and a resume after a real SIGKILL."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from verbmirage.models.derived import DerivedBusyError
from verbmirage.models.derived.finetune import (
    PREVIOUS_STATE_FILE,
    STATE_FILE,
    TRAIN_LOG_FILE,
    _load_checkpoint,
    _save_checkpoint,
    answer_loss_sum,
    build,
    checkpoint_folder,
    load_base,
    read_examples,
    step_examples,
    total_steps,
    train,
    training_batch,
)
from verbmirage.models.derived.finetune_settings import LANGUAGE_MODEL_LINEARS, FinetuneSettings
from verbmirage.benchmark.pangea_training import build_training_questions, write_demo_pangea
from verbmirage.benchmark.pangea_settings import TrainingQuestionSettings
from verbmirage.data.pangea import load_pangea
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import TRAIN_LOG
from verbmirage.models.base import Question
from verbmirage.models.registry import create_model
from verbmirage.models.tiny import build_tiny_llava

REPO = Path(__file__).resolve().parents[2]
# The tiny model's lm_head has tiny random rows: without LoRA on it the answers cannot become confident.
MEMORISE = {"rank": 8, "alpha": 16, "dropout": 0.0, "learning_rate": 2e-2, "batch_size": 8, "micro_batch_size": 8,
            "max_steps": 40, "warmup_ratio": 0.0, "scheduler": "constant",
            "target_modules": r".*language_model.*\.(q_proj|v_proj|down_proj)|lm_head"}


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("model") / "tiny_llava")


@pytest.fixture(scope="module")
def training_set(tmp_path_factory) -> tuple[Path, Path]:
    """8 MC + 8 YN Pangea questions of the demo Pangea and the folder of their images."""
    root = write_demo_pangea(tmp_path_factory.mktemp("pangea") / "Data")
    data = load_pangea(root)
    built = build_training_questions(data, TrainingQuestionSettings(mc_questions=8, yn_questions=8))
    path = root.parent / "questions.parquet"
    write_table(built.questions, path, QUESTIONS)
    return path, data.images


def entry(model: Path, **extra) -> dict:
    return {"backend": "llava", "path": str(model), "local_files_only": True, **extra}


def test_defaults_are_the_papers_and_llavas_and_match_the_schema():
    settings = FinetuneSettings()
    assert (settings.learning_rate, settings.batch_size) == (2e-5, 64)  # paper, Appendix D
    assert (settings.rank, settings.alpha, settings.dropout) == (128, 256, 0.05)  # LLaVA finetune_task_lora.sh
    assert (settings.epochs, settings.warmup_ratio, settings.scheduler, settings.weight_decay) == (1.0, 0.03, "cosine",
                                                                                                   0.0)
    assert settings.accumulation == 8
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    derive = schema["properties"]["models"]["additionalProperties"]["properties"]["derive"]
    block = next(rule["then"] for rule in derive["allOf"] if rule["if"]["properties"]["method"]["const"]
                 == "lora_finetune")
    declared = {key: spec["default"] for key, spec in block["properties"].items() if "default" in spec}
    assert declared == {key: getattr(settings, key) for key in declared}
    assert set(block["properties"]) == set(FinetuneSettings.__dataclass_fields__) | {"method", "base"}


@pytest.mark.parametrize("settings, message", [
    ({"rnak": 8}, r"models.x.derive: unknown lora_finetune setting\(s\) \['rnak'\]"),
    ({"batch_size": 64, "micro_batch_size": 6}, "batch_size .* multiple of micro_batch_size"),
    ({"questions": "q.parquet"}, "questions and images go together"),
    ({"pangea": {"mc_questions": 5, "colour": 1}}, r"pangea: unknown setting\(s\) \['colour'\]"),
])
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        FinetuneSettings.from_config(settings, "models.x.derive")


def test_each_epoch_visits_every_question_once():
    settings = FinetuneSettings(batch_size=4, micro_batch_size=2, epochs=3, seed=5)
    steps = total_steps(settings, 10)
    assert steps == 8  # ceil(3 * 10 / 4)
    order = [i for step in range(steps) for i in step_examples(step, settings, 10)]
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:20]) == list(range(10))
    assert order[:10] != order[10:20]  # a new permutation per epoch
    assert step_examples(3, settings, 10) == step_examples(3, FinetuneSettings(batch_size=4, micro_batch_size=2,
                                                                                seed=5), 10)


def test_labels_cover_only_the_answer_tokens(tiny_llava, training_set):
    vlm = load_base("x", entry(tiny_llava), FinetuneSettings())
    examples = read_examples(*training_set)
    chosen = [next(e for e in examples if e.multiple_choice), next(e for e in examples if not e.multiple_choice)]
    chosen.append(next(e for e in examples if not e.multiple_choice and e.answer != chosen[1].answer))
    batch = training_batch(vlm, chosen)
    labels, ids, attention = batch["labels"], batch["input_ids"], batch["attention_mask"]
    assert ids.shape[0] == 3 and len(set(attention.sum(1).tolist())) > 1  # rows of different lengths, padded
    for row, example in enumerate(chosen):
        kept = (labels[row] != -100).nonzero().flatten()
        end = int(attention[row].sum())
        assert kept.tolist() == list(range(end - len(kept), end))  # the last real tokens, none in the padding
        assert (labels[row, kept] == ids[row, kept]).all()
        assert vlm.tokenizer.decode(labels[row, kept]) == f" {example.target}</s>"
        # everything before is the prompt the engine scores with
        prompt = vlm.render(Question("q", example.prompt, example.image), example.multiple_choice)
        assert vlm.tokenizer.decode(ids[row, : kept[0]]).replace("<image>", "") == prompt.replace("<image>", "")
    assert {e.target for e in chosen} >= {"Yes", "No"}
    loss, count = answer_loss_sum(vlm.model, batch)
    assert count == int((labels[:, 1:] != -100).sum()) and torch.isfinite(loss)


def score(model, questions: Path, images: Path) -> tuple[list[str], list[str], list[str], list[str]]:
    frame = read_table(questions, QUESTIONS)
    yn, mc = frame[frame.qset == "train_yn"], frame[frame.qset == "train_mc"]
    yes_no = model.score_yes_no([Question(i, p, images / image) for i, p, image in zip(yn.question_id, yn.prompt,
                                                                                         yn.image)])
    choice = model.score_multiple_choice([Question(i, p, images / image, tuple(o)) for i, p, image, o in
                                          zip(mc.question_id, mc.prompt, mc.image, mc.options)])
    return [r.prediction for r in yes_no], yn.answer.tolist(), [r.prediction for r in choice], mc.answer.tolist()


def test_the_finetune_memorises_a_small_set_and_the_adapter_loads_as_a_model_entry(tmp_path, tiny_llava,
                                                                                 training_set):
    torch.set_num_threads(1)
    questions, images = training_set
    output = tmp_path / "results" / "models" / "tiny_llava_ft"
    build("tiny_llava_ft", {**MEMORISE, "checkpoint_every": 15}, entry(tiny_llava), output,
          {"questions": str(questions), "images": str(images)})
    assert {"adapter_config.json", "adapter_model.safetensors", TRAIN_LOG_FILE} <= {p.name for p in output.iterdir()}
    assert not checkpoint_folder(output).exists()  # removed after success
    trained = read_table(output / TRAIN_LOG_FILE, TRAIN_LOG)
    assert trained.step.tolist() == list(range(1, 41)) and (trained.tokens == 16).all()  # 16 x (answer + </s>)
    assert trained.loss.iloc[-5:].mean() < 0.25 * trained.loss.iloc[:5].mean()
    assert np.allclose(trained.lr, 2e-2)
    config = json.loads((output / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (8, 16)
    base = score(create_model("base", entry(tiny_llava)), questions, images)
    tuned = score(create_model("tuned", entry(tiny_llava, adapter=str(output))), questions, images)
    assert tuned[0] == tuned[1] and tuned[2] == tuned[3]  # every training answer, through the evaluation engine
    assert base[0] != base[1] and base[2] != base[3]


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path):
    _save_checkpoint(tmp_path, {"fingerprint": "a", "step": 3})
    assert _load_checkpoint(tmp_path, "a")["step"] == 3
    assert _load_checkpoint(tmp_path, "b") is None
    assert _load_checkpoint(tmp_path / "none", "a") is None


class _RunsCode:
    """Unpickling this would call os.system: a checkpoint carrying a payload."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("damage", ["empty", "truncated", "payload"])
def test_a_damaged_checkpoint_is_named_removed_and_the_one_before_resumed(tmp_path, caplog, damage):
    _save_checkpoint(tmp_path, {"fingerprint": "a", "step": 3, "weights": torch.ones(300)})
    _save_checkpoint(tmp_path, {"fingerprint": "a", "step": 6, "weights": torch.ones(300)})
    latest, previous = tmp_path / STATE_FILE, tmp_path / PREVIOUS_STATE_FILE
    assert torch.load(previous, weights_only=True)["step"] == 3  # kept until a newer one is written
    if damage == "empty":
        latest.write_bytes(b"")
    elif damage == "truncated":
        latest.write_bytes(latest.read_bytes()[:400])
    else:
        torch.save({"fingerprint": "a", "step": 6, "x": _RunsCode(tmp_path / "ran")}, latest)
    with caplog.at_level(logging.WARNING):
        state = _load_checkpoint(tmp_path, "a")
    assert state["step"] == 3
    assert f"{latest}: unreadable checkpoint" in caplog.text and "the checkpoint before it" in caplog.text
    assert "weights_only" not in caplog.text  # never the advice to load it unsafely
    assert not latest.exists() and not (tmp_path / "ran").exists()
    previous.write_bytes(b"")  # both damaged: from the start
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _load_checkpoint(tmp_path, "a") is None
    assert f"{previous}: unreadable checkpoint" in caplog.text


def test_a_damaged_first_checkpoint_says_training_starts_over(tmp_path, caplog):
    _save_checkpoint(tmp_path, {"fingerprint": "a", "step": 3, "weights": torch.ones(300)})
    (tmp_path / STATE_FILE).write_bytes(b"")  # no checkpoint before it
    with caplog.at_level(logging.WARNING):
        assert _load_checkpoint(tmp_path, "a") is None
    assert "training resumes from the start" in caplog.text and "before it" not in caplog.text


def test_a_zero_byte_checkpoint_resumes_from_the_one_before_and_trains_the_same(tmp_path, caplog, tiny_llava,
                                                                              training_set):
    """A fine-tune stopped after step 7 (checkpoints at 4 and 6), its latest checkpoint then zeroed: the rerun
    resumes at step 4 and ends with the uninterrupted run's train log."""
    torch.set_num_threads(1)
    questions, images = training_set
    settings = FinetuneSettings.from_config({**MEMORISE, "batch_size": 2, "micro_batch_size": 2, "max_steps": 8,
                                             "checkpoint_every": 2, "dropout": 0.1, "seed": 3})
    reference = train("ft", settings, entry(tiny_llava), questions, images, tmp_path / "reference")

    def stop_at_7(step: int, loss: float) -> None:
        if step == 7:
            raise KeyboardInterrupt("stopped after step 7")

    output = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train("ft", settings, entry(tiny_llava), questions, images, output, on_step=stop_at_7)
    (checkpoint_folder(output) / STATE_FILE).write_bytes(b"")
    with caplog.at_level(logging.INFO, logger="verbmirage.models.derived.finetune"):
        resumed = train("ft", settings, entry(tiny_llava), questions, images, output)
    assert "unreadable checkpoint (EOFError: the file is empty or cut short)" in caplog.text
    assert "resumed at step 4 of 8" in caplog.text
    pd.testing.assert_frame_equal(resumed, reference, rtol=1e-4)


def test_a_second_finetune_of_one_output_fails_at_once_naming_the_first(tmp_path, tiny_llava, training_set):
    questions, images = training_set
    settings = {"rank": 4, "alpha": 8, "batch_size": 2, "micro_batch_size": 2, "max_steps": 6, "checkpoint_every": 1}
    output = tmp_path / "results" / "models" / "ft"
    first = _driver(tmp_path, "first", {"model": str(tiny_llava), "questions": str(questions), "images": str(images),
                                        "settings": settings, "output": str(output), "seconds_per_step": 0.5,
                                        "steps_file": str(tmp_path / "first.steps")})
    deadline = time.monotonic() + 300
    while not (checkpoint_folder(output) / STATE_FILE).exists():
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    with pytest.raises(DerivedBusyError, match=rf"derived model {output}: another job is writing it right now "
                                               rf"\(pid {first.pid} on host "):
        train("ft", FinetuneSettings.from_config(settings), entry(tiny_llava), questions, images, output)
    assert (checkpoint_folder(output) / STATE_FILE).exists()  # nothing of the first was touched
    assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert read_table(output / TRAIN_LOG_FILE, TRAIN_LOG).step.tolist() == list(range(1, 7))


def test_build_names_missing_inputs(tmp_path):
    with pytest.raises(ValueError, match="models.x.derive: the build needs input 'images'"):
        build("x", {}, {}, tmp_path, {"questions": "q.parquet"})


def _driver(tmp_path: Path, name: str, spec: dict) -> subprocess.Popen:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "finetune_driver.py"), str(path)],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "w"))


def test_a_killed_finetune_resumes_where_it_stopped(tmp_path, tiny_llava, training_set):
    questions, images = training_set
    settings = {"rank": 4, "alpha": 8, "dropout": 0.1, "learning_rate": 1e-2, "batch_size": 4, "micro_batch_size": 2,
                "max_steps": 16, "warmup_ratio": 0.2, "checkpoint_every": 4, "seed": 7}
    common = {"model": str(tiny_llava), "questions": str(questions), "images": str(images), "settings": settings}
    reference_out, killed_out = tmp_path / "reference" / "model", tmp_path / "killed" / "model"
    reference = _driver(tmp_path, "reference", {**common, "output": str(reference_out), "seconds_per_step": 0,
                                                "steps_file": str(tmp_path / "reference.steps")})
    victim = _driver(tmp_path, "victim", {**common, "output": str(killed_out), "seconds_per_step": 0.5,
                                          "steps_file": str(tmp_path / "victim.steps")})
    state, victim_steps = checkpoint_folder(killed_out) / STATE_FILE, tmp_path / "victim.steps"

    def past_the_first_checkpoint() -> bool:
        # on_step follows its step's checkpoint: wait for step 4's own line, so the kill lands in the pause after it
        return state.exists() and victim_steps.exists() and len(victim_steps.read_text().split()) >= 4

    deadline = time.monotonic() + 300
    while not past_the_first_checkpoint():
        assert victim.poll() is None, (tmp_path / "victim.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)  # what SLURM does at the time limit (after its SIGTERM grace)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not killed_out.exists()  # killed mid-training: no adapter written
    ran_before = [int(s) for s in victim_steps.read_text().split()]
    assert 4 <= max(ran_before) < 16
    checkpoint_step = torch.load(state, weights_only=True)["step"]
    assert checkpoint_step in (4, 8, 12)

    rerun = _driver(tmp_path, "rerun", {**common, "output": str(killed_out), "seconds_per_step": 0,
                                        "steps_file": str(tmp_path / "rerun.steps")})
    assert rerun.wait(timeout=600) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    assert reference.wait(timeout=600) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    resumed_steps = [int(s) for s in (tmp_path / "rerun.steps").read_text().split()]
    assert resumed_steps == list(range(checkpoint_step + 1, 17))  # no step done twice after the checkpoint
    assert f"resumed at step {checkpoint_step} of 16" in (tmp_path / "rerun.log").read_text()
    uninterrupted = read_table(reference_out / TRAIN_LOG_FILE, TRAIN_LOG)
    resumed = read_table(killed_out / TRAIN_LOG_FILE, TRAIN_LOG)
    assert resumed.step.tolist() == uninterrupted.step.tolist() == list(range(1, 17))
    pd.testing.assert_series_equal(resumed.lr, uninterrupted.lr, rtol=1e-9)
    pd.testing.assert_series_equal(resumed.loss, uninterrupted.loss, rtol=1e-4)
    assert resumed.loss.iloc[-1] != resumed.loss.iloc[0]  # it trained
    assert not checkpoint_folder(killed_out).exists()


def test_target_modules_default_matches_only_the_language_models_linears(tiny_llava):
    import re

    model = load_base("x", entry(tiny_llava), FinetuneSettings()).model
    matched = {name for name, _ in model.named_modules() if re.fullmatch(LANGUAGE_MODEL_LINEARS, name)}
    assert matched and all(".language_model." in name for name in matched)
    assert {name.rsplit(".", 1)[1] for name in matched} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"}
    assert not any("vision_tower" in name or "projector" in name for name in matched)


def test_a_bfloat16_base_trains_float32_lora_weights(tmp_path, tiny_llava, training_set):
    """The GPU configuration (bfloat16 base), run on CPU: LoRA weights stay float32 (peft's adapter autocast), so
    updates of lr 2e-5 are not rounded away, and the saved adapter loads on a float32 base."""
    from safetensors.torch import load_file

    questions, images = training_set
    output = tmp_path / "bf16"
    frame = train("bf16", FinetuneSettings(rank=4, alpha=8, batch_size=4, micro_batch_size=2, max_steps=2,
                                           dtype="bfloat16", device="cpu"), entry(tiny_llava), questions, images,
                  output)
    assert frame.loss.notna().all() and len(frame) == 2
    tensors = load_file(output / "adapter_model.safetensors")
    assert tensors and {t.dtype for t in tensors.values()} == {torch.float32}
    assert any(float(t.abs().max()) > 0 for name, t in tensors.items() if "lora_B" in name)  # it moved
    create_model("loaded", entry(tiny_llava, adapter=str(output)))  # keys match: refused otherwise


def test_any_question_table_of_ours_trains(tmp_path, tiny_llava, demo_roots, demo_anno):
    """The generic form (derive.questions + images): here benchmark questions of the demo HICO's training
    split, YN and MC together, images relative to the HICO root."""
    from verbmirage.benchmark.questions import QuestionSettings, build_question_sets

    sets = build_question_sets(demo_anno, ["yn_obj", "mc_verb"], QuestionSettings(split="train"))
    table = pd.concat([sets["yn_obj"].head(6), sets["mc_verb"].head(6)], ignore_index=True)
    write_table(table, tmp_path / "questions.parquet", QUESTIONS)
    output = tmp_path / "model"
    build("hq", {"questions": str(tmp_path / "questions.parquet"), "images": str(demo_roots[0]), "rank": 4,
                 "alpha": 8, "batch_size": 4, "micro_batch_size": 4, "epochs": 1.0},
          entry(tiny_llava), output, {"questions": str(tmp_path / "questions.parquet"), "images": str(demo_roots[0])})
    log = read_table(output / TRAIN_LOG_FILE, TRAIN_LOG)
    assert log.step.tolist() == [1, 2, 3] and (log.tokens == 8).all()
