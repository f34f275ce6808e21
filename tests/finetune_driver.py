"""Run one LoRA fine-tune in its own process (tests/models/test_finetune.py kills it mid-training, then reruns it).

Usage: python finetune_driver.py SPEC.json. SPEC: model (tiny LLaVA folder), questions, images, output,
settings (FinetuneSettings), seconds_per_step (a pause after each step, so the kill lands mid-training),
steps_file (each executed step appended, one per line).
"""

import json
import logging
import sys
import time
from pathlib import Path

import torch

from verbmirage.models.derived.finetune import train
from verbmirage.models.derived.finetune_settings import FinetuneSettings

spec = json.loads(Path(sys.argv[1]).read_text())
logging.basicConfig(level=logging.INFO)  # "resumed at step N" reaches the log
torch.set_num_threads(1)  # the same float summation order in every run


def on_step(step: int, loss: float) -> None:
    with open(spec["steps_file"], "a") as stream:
        stream.write(f"{step}\n")
    time.sleep(spec["seconds_per_step"])


entry = {"backend": "llava", "path": spec["model"], "local_files_only": True}
train("tiny_llava_ft", FinetuneSettings.from_config(spec["settings"]), entry, Path(spec["questions"]),
      Path(spec["images"]), Path(spec["output"]), on_step=on_step)
