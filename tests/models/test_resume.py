"""Sharding, atomic parts, and a real SIGKILL of a running inference process followed by a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from verbmirage.benchmark.conditions import apply_condition
from verbmirage.inference.runs import IncompleteShardError, image_shard, merge_shards, select_suite_shard
from verbmirage.inference.store import PartStore, parts_directory
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared(demo_anno, demo_roots, tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(240)
    write_table(questions, base / "yn_obj.parquet", QUESTIONS)
    apply_condition(demo_roots[0], sorted(set(questions.image)), base / "clean", "clean", {"type": "clean"})
    return base, questions


def test_shards_partition_by_image(prepared):
    _, questions = prepared
    shards = [select_suite_shard(questions, i, 3) for i in range(3)]
    assert sum(len(s) for s in shards) == len(questions)
    assert set().union(*(set(s.question_id) for s in shards)) == set(questions.question_id)
    images = [set(s.image) for s in shards]
    assert not (images[0] & images[1] or images[1] & images[2] or images[0] & images[2])
    assert all(image_shard(image, 3) == i for i, shard_images in enumerate(images) for image in shard_images)
    assert all(images)  # 240 questions: no shard is empty
    with pytest.raises(ValueError, match="shard 3"):
        select_suite_shard(questions, 3, 3)


def test_part_store_discards_parts_of_other_settings(tmp_path):
    rows = [{"question_id": "q1", "raw_answer": "yes", "prediction": "yes", "parse_rule": "t", "p_yes": 0.9,
             "option_probs": None, "confidence": 0.9, "error": None}]
    store = PartStore(tmp_path / "parts", "fingerprint-a")
    store.append(rows)
    store.close()
    (tmp_path / "parts" / ".part-000001.parquet.x.tmp").write_bytes(b"cut off")
    assert PartStore(tmp_path / "parts", "fingerprint-a").rows().question_id.tolist() == ["q1"]
    assert not list((tmp_path / "parts").glob(".*.tmp"))
    assert PartStore(tmp_path / "parts", "fingerprint-b").rows().empty


def test_merge_refuses_missing_and_doubled_answers(prepared):
    _, questions = prepared
    few = questions.head(3)
    answers = pd.DataFrame({"question_id": few.question_id, "raw_answer": "yes", "prediction": "yes",
                            "parse_rule": "t", "p_yes": 1.0, "option_probs": None, "confidence": 1.0, "error": None})
    assert merge_shards(few, [answers.iloc[2:], answers.iloc[:2]]).question_id.tolist() == few.question_id.tolist()
    with pytest.raises(IncompleteShardError, match="answered twice"):
        merge_shards(few, [answers, answers.iloc[:1]], where="x.parquet")
    with pytest.raises(IncompleteShardError, match="x.parquet: 1 questions have no answer"):
        merge_shards(few, [answers.iloc[1:]], where="x.parquet")


def _command(base: Path, output: Path) -> list[str]:
    return [
        sys.executable, "-m", "verbmirage", "predict",
        "--questions", str(base / "yn_obj.parquet"), "--images", str(base / "clean"),
        "--model-name", "slow", "--model", json.dumps({"backend": "slow_backend:SlowModel", "seconds_per_batch": 0.05}),
        "--output", str(output), "--shard", "0", "--shards", "1", "--batch-size", "4", "--part-size", "8",
    ]


def test_sigkill_then_resume_equals_uninterrupted_run(prepared, tmp_path):
    base, questions = prepared
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    reference = tmp_path / "reference.parquet"
    subprocess.run(_command(base, reference), env=env, check=True, capture_output=True, timeout=600)

    killed = tmp_path / "killed.parquet"
    process = subprocess.Popen(_command(base, killed), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parts = parts_directory(killed)
    deadline = time.monotonic() + 120
    while len(list(parts.glob("part-*.parquet"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert not killed.exists()
    answered = PartStore(parts, json.loads((parts / "fingerprint.json").read_text())["fingerprint"]).rows()
    assert 0 < len(answered) < len(questions), "the kill did not land mid-run"

    resumed = subprocess.run(_command(base, killed), env=env, check=True, capture_output=True, text=True, timeout=600)
    assert f"resuming: {len(answered)} of {len(questions)}" in resumed.stderr
    first, second = read_table(reference, PREDICTIONS), read_table(killed, PREDICTIONS)
    assert second.question_id.is_unique and len(second) == len(questions)
    pd.testing.assert_frame_equal(first, second)
    assert killed.read_bytes() == reference.read_bytes()  # the same file, byte for byte
    assert [p.name for p in parts.glob("part-*.parquet")] == ["part-000000.parquet"]  # only the finished table


def test_sigkill_then_resume_of_the_suite_job_equals_uninterrupted_run(prepared, demo_anno, tmp_path):
    """The one-job-per-shard path (every set of an image together): killed mid-run, resumed, same rows."""
    base, questions = prepared
    mc = build_question_set(demo_anno, "mc_obj", QuestionSettings())
    write_table(mc[mc.image.isin(set(questions.image))].reset_index(drop=True), tmp_path / "mc_obj.parquet",
                QUESTIONS)
    sets = [str(base / "yn_obj.parquet"), str(tmp_path / "mc_obj.parquet")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}

    def command(output: Path) -> list[str]:
        return [sys.executable, "-m", "verbmirage", "predict-suite", "--questions", *sets,
                "--images", str(base / "clean"), "--model-name", "slow",
                "--model", json.dumps({"backend": "slow_backend:SlowModel", "seconds_per_batch": 0.05}),
                "--output", str(output), "--batch-size", "4", "--part-size", "8"]

    reference = tmp_path / "reference"
    subprocess.run(command(reference), env=env, check=True, capture_output=True, timeout=600)
    killed = tmp_path / "killed"
    process = subprocess.Popen(command(killed), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parts = parts_directory(killed)
    deadline = time.monotonic() + 120
    while len(list(parts.glob("*/part-*.parquet"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert not killed.exists()
    answered = sum(len(PartStore(parts / qset).rows()) for qset in ("yn_obj", "mc_obj"))
    assert 0 < answered < len(questions) + len(read_table(tmp_path / "mc_obj.parquet")), "the kill did not land mid-run"

    resumed = subprocess.run(command(killed), env=env, check=True, capture_output=True, text=True, timeout=600)
    assert "resuming:" in resumed.stderr
    for qset in ("yn_obj", "mc_obj"):
        first = read_table(reference / f"{qset}.parquet", PREDICTIONS).sort_values("question_id", ignore_index=True)
        second = read_table(killed / f"{qset}.parquet", PREDICTIONS).sort_values("question_id", ignore_index=True)
        assert second.question_id.is_unique
        pd.testing.assert_frame_equal(first, second)
        # the same file, byte for byte: row groups do not follow the parts a kill left
        assert (reference / f"{qset}.parquet").read_bytes() == (killed / f"{qset}.parquet").read_bytes()
        # the answers stay as one hard-linked part per set for a later rerun
        assert [p.name for p in (parts / qset).glob("part-*.parquet")] == ["part-000000.parquet"]
