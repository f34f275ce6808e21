"""The demo's Pangea fine-tune (models.tiny_llava_pangea: LoRA on tiny_llava), built and evaluated through the DAG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from verbmirage.models.derived import DERIVED_FOLDER
from verbmirage.models.derived.finetune import TRAIN_LOG_FILE, checkpoint_folder
from verbmirage.models.derived.finetune_settings import LANGUAGE_MODEL_LINEARS
from verbmirage.data.hico import load_hico
from verbmirage.core.io import read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import MITIGATION_TABLE5, PANGEA_SOURCES, TRAIN_LOG
from verbmirage.models.adapters import saved_adapter_keys

pytestmark = pytest.mark.slow

SLUG = "tiny_llava_pangea"
QSETS = ["yn_obj", "yn_verb", "mc_obj", "mc_verb"]
PAPER_METHOD = "Pangea-LoRA (paper's method)"


def _derive(demo_run) -> dict:
    return yaml.safe_load((demo_run / "config.yaml").read_text())["models"][SLUG]["derive"]


def test_the_adapter_and_its_train_log(demo_run):
    folder = demo_run / DERIVED_FOLDER.format(model=SLUG)
    derive = _derive(demo_run)
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (derive["rank"], derive["alpha"])
    assert config["target_modules"] == LANGUAGE_MODEL_LINEARS
    keys = saved_adapter_keys(folder)
    # tiny LLaVA: 2 decoder layers x 7 linears x (A, B), nothing else
    assert len(keys) == 28 and all("lora_" in key and "language_model" in key for key in keys)
    questions = read_table(demo_run / f"results/training/{SLUG}/questions.parquet", QUESTIONS)
    log = read_table(folder / TRAIN_LOG_FILE, TRAIN_LOG)
    steps = math.ceil(derive["epochs"] * len(questions) / derive["batch_size"])
    assert log.step.tolist() == list(range(1, steps + 1))
    assert (log.tokens == 2 * derive["batch_size"]).all()  # one answer token and </s> per question
    assert log.loss.notna().all() and (log.loss > 0).all()
    assert log.lr.max() == pytest.approx(derive["learning_rate"], rel=0.05) and log.lr.iloc[-1] < log.lr.max()
    assert not checkpoint_folder(folder).exists()


def test_the_training_questions_leave_hico_out(demo_run):
    questions = read_table(demo_run / f"results/training/{SLUG}/questions.parquet", QUESTIONS)
    derive = _derive(demo_run)
    assert set(questions.qset) == {"train_mc", "train_yn"} and set(questions.dataset) == {"pangea"}
    assert (questions.qset == "train_yn").sum() == derive["pangea"]["yn_questions"]
    assert 0 < (questions.qset == "train_mc").sum() <= derive["pangea"]["mc_questions"]
    sources = read_table(demo_run / f"results/training/{SLUG}/sources.parquet", PANGEA_SOURCES).set_index("source")
    assert sources.excluded_by[["Kinetics700", "HAKE", "HICO_DET"]].tolist() == ["kinetics*", "hake*", "hico*"]
    assert sources.loc[["Kinetics700", "HAKE", "HICO_DET"], "images"].eq(0).all()
    anno = load_hico(demo_run / "resources/demo/hico_20150920")
    test_stems = {Path(name).stem for name in anno.images["test"]}
    assert not {Path(image).stem for image in questions.image} & test_stems
    assert all(not image.startswith(("HICO", "Kinetics", "HAKE")) for image in questions.image)
    summary = (demo_run / f"results/training/{SLUG}/summary.md").read_text()
    assert "| selected nodes covered | 7 of 8 | 280 of 290 |" in summary


def test_its_predictions_and_table5_row(demo_run):
    from workflow_run import derived_model_runs

    from verbmirage.evaluation.paper_methods import paper_methods_from_config

    # the demo's small recipe is not the paper's: a variant of its method, never compared with its row
    method = paper_methods_from_config(yaml.safe_load((demo_run / "config.yaml").read_text()))[SLUG]
    assert method.startswith("Pangea-LoRA (variant of the paper's method: Yes:No 1:2, the paper's 1:19; another "
                             "MC stem; 24 MC + 24 YN questions")
    for model in derived_model_runs(demo_run, SLUG, QSETS, method):  # the base, the adapter on top
        assert model["backend"] == "llava" and model["path"] == "resources/models/tiny_llava"
        assert model["adapter"] == DERIVED_FOLDER.format(model=SLUG) and "derive" not in model
    table5 = read_table(demo_run / "results/tables/table5.parquet", MITIGATION_TABLE5)
    paper = table5[(table5.source == "paper") & (table5.method == PAPER_METHOD)]
    assert paper.yn_obj_acc.tolist() == [pytest.approx(78.48)]
    lines = (demo_run / "results/tables/table5.md").read_text().splitlines()
    assert any(SLUG in line and "measured" in line for line in lines)
    assert not any(SLUG in line and "Δ" in line for line in lines)  # no difference against the paper's row
