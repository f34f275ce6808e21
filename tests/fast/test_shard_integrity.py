"""A shard's output is complete or the job fails loudly.

Each test replays a probe that lost rows or exited 0 on incomplete output before these fixes.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from verbmirage.benchmark.conditions import ImageResolver, apply_condition
from verbmirage.data.identity import ContentVersions
from verbmirage.inference.runs import (
    DamagedShardError,
    RunSpec,
    IncompleteShardError,
    predict,
    run_shard,
    run_suite,
    suite_calls,
    suite_order,
)
from verbmirage.inference.shards import merge_suite_shards, shard_provenance
from verbmirage.inference.store import PartStore, ShardBusyError, fingerprint, parts_directory, run_settings
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.models.base import NO, YES, FatalBackendError, VisionLanguageModel, YesNoResult
from verbmirage.benchmark.questions import QuestionSettings, build_question_set

TESTS = Path(__file__).resolve().parents[1]


class ScriptedModel(VisionLanguageModel):
    """Answers from the question id; fails as told: ``fail`` ids get an error row, ``transient`` a retry row,
    and the ``fatal_after``-th batch raises :class:`FatalBackendError`."""

    backend = "test_shard_integrity:ScriptedModel"

    def __init__(self, name: str, fail: tuple = (), transient: tuple = (), fatal_after: int | None = None):
        super().__init__(name)
        self.fail, self.transient, self.fatal_after = set(fail), set(transient), fatal_after
        self.batches = 0
        self.asked: list[str] = []

    def _score_yes_no(self, questions):
        self.batches += 1
        if self.fatal_after is not None and self.batches > self.fatal_after:
            raise FatalBackendError("HTTP 401: invalid key")
        results = []
        for q in questions:
            self.asked.append(q.question_id)
            if q.question_id in self.fail:
                results.append(YesNoResult.failed("HTTP 400: bad request"))
            elif q.question_id in self.transient:
                results.append(YesNoResult.failed("HTTP 503 after 6 attempts", retry=True))
            else:
                p = (zlib.crc32(q.question_id.encode()) % 100) / 100
                results.append(YesNoResult(p, YES if p >= 0.5 else NO, "x", 1.0, "test"))
        return results

    def _score_multiple_choice(self, questions):
        raise NotImplementedError


@pytest.fixture(scope="module")
def prepared(demo_anno, demo_roots, tmp_path_factory):
    base = tmp_path_factory.mktemp("integrity")
    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(120).reset_index(drop=True)
    write_table(questions, base / "yn_obj.parquet", QUESTIONS)
    apply_condition(demo_roots[0], sorted(set(questions.image)), base / "clean", "clean", {"type": "clean"})
    return base, questions


def _resolver(base):
    from verbmirage.benchmark.conditions import ImageResolver

    return ImageResolver(base / "clean")


def test_resume_after_a_deleted_middle_part_gives_every_row_once(prepared, tmp_path):
    base, questions = prepared
    store = PartStore(tmp_path / "parts", "f")
    predict(questions, ScriptedModel("m"), _resolver(base), batch_size=8, store=store, part_size=24)
    parts = sorted((tmp_path / "parts").glob("part-*.parquet"))
    assert len(parts) >= 3  # a part every part_size rows, at the end of a model call
    kept = {p.name: p.read_bytes() for p in parts if p.name != "part-000001.parquet"}
    lost = set(pd.read_parquet(tmp_path / "parts" / "part-000001.parquet").question_id)
    (tmp_path / "parts" / "part-000001.parquet").unlink()

    model = ScriptedModel("m")
    frame = predict(questions, model, _resolver(base), batch_size=8, store=store, part_size=24)
    assert set(model.asked) == lost  # only the lost part's questions are asked again
    assert frame.question_id.tolist() == questions.question_id.tolist()
    for name, data in kept.items():  # no part was overwritten
        assert (tmp_path / "parts" / name).read_bytes() == data
    assert (tmp_path / "parts" / f"part-{len(parts):06d}.parquet").is_file()  # the new part: one past the highest
    store.close()


def test_damaged_parts_and_fingerprint_are_removed_and_reasked(prepared, tmp_path, caplog):
    base, questions = prepared
    directory = tmp_path / "parts"
    store = PartStore(directory, "f")
    predict(questions, ScriptedModel("m"), _resolver(base), batch_size=8, store=store, part_size=24)
    store.close()
    lost = {q for n in (1, 2) for q in pd.read_parquet(directory / f"part-00000{n}.parquet").question_id}
    (directory / "part-000001.parquet").write_bytes(b"")  # zero bytes
    data = (directory / "part-000002.parquet").read_bytes()
    (directory / "part-000002.parquet").write_bytes(data[: len(data) // 2])  # truncated
    with caplog.at_level(logging.WARNING):
        store = PartStore(directory, "f")
        model = ScriptedModel("m")
        frame = predict(questions, model, _resolver(base), batch_size=8, store=store, part_size=24)
    assert "part-000001.parquet: unreadable part" in caplog.text
    assert "part-000002.parquet: unreadable part" in caplog.text
    assert set(model.asked) == lost and len(model.asked) == len(lost)
    assert frame.question_id.is_unique and len(frame) == len(questions)
    store.close()

    (directory / "fingerprint.json").write_text("")  # as left by a failed non-atomic write
    with caplog.at_level(logging.WARNING):
        store = PartStore(directory, "f")
    assert "fingerprint.json: unreadable fingerprint" in caplog.text
    assert store.rows().empty
    assert json.loads((directory / "fingerprint.json").read_text()) == {"fingerprint": "f"}
    store.close()


def test_a_second_writer_fails_at_once_naming_the_folder(prepared, tmp_path):
    base, _ = prepared
    output = tmp_path / "shard.parquet"
    holder = PartStore(parts_directory(output), "whatever")  # a live job on this shard
    command = [
        sys.executable, "-m", "verbmirage", "predict", "--questions", str(base / "yn_obj.parquet"),
        "--images", str(base / "clean"), "--model-name", "p", "--model", json.dumps({"backend": "always_yes"}),
        "--output", str(output),
    ]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "another job is writing this shard" in result.stderr
    assert str(parts_directory(output)) in result.stderr
    assert f"pid {os.getpid()} on host " in result.stderr  # the job to wait for or stop
    assert time.monotonic() - started < 60 and not output.exists()
    with pytest.raises(ShardBusyError):
        PartStore(parts_directory(output), "whatever")
    holder.close()
    PartStore(parts_directory(output), "whatever").close()  # free again once the holder is gone


def _stored_rows(output) -> pd.DataFrame:
    """The rows a failed job left for its resume (read under the job's own fingerprint)."""
    parts = parts_directory(output)
    store = PartStore(parts, json.loads((parts / "fingerprint.json").read_text())["fingerprint"])
    try:
        return store.rows()
    finally:
        store.close()


def _run(base, output, model_settings, **kwargs):
    return run_shard(base / "yn_obj.parquet", output, RunSpec("m", model_settings, base / "clean", batch_size=8, part_size=8, **kwargs))


def test_too_many_error_rows_fail_the_job_and_keep_the_parts(prepared, tmp_path, caplog):
    base, questions = prepared
    output = tmp_path / "out.parquet"
    failing = {"backend": "test_shard_integrity:ScriptedModel", "fail": list(questions.question_id[:10])}
    with pytest.raises(IncompleteShardError, match=r"more than max_error_share=0.05; first error: HTTP 400"):
        _run(base, output, failing)
    assert not output.exists()
    assert list(parts_directory(output).glob("part-*.parquet"))
    # the job stops after the call that passed the limit, with every row of that call stored: a resume asks
    # whole calls, as an uninterrupted run does
    stored = set(_stored_rows(output).question_id)
    ordered = suite_order(questions)
    calls = [set(ordered.question_id.iloc[list(call)]) for call in suite_calls(ordered.image.tolist(), 8)]
    assert stored and all(call <= stored or not call & stored for call in calls)
    # a higher limit accepts them; the stored error rows are asked again and answered the same way
    with caplog.at_level(logging.WARNING, logger="verbmirage.inference.runs"):
        frame = _run(base, output, failing, max_error_share=0.2)
    assert frame.error.notna().sum() == 10 and len(frame) == len(questions)
    # the parts folder now holds only the finished table (a hard link), for a rerun to reuse
    assert [p.name for p in parts_directory(output).glob("part-*.parquet")] == ["part-000000.parquet"]
    assert (parts_directory(output) / "part-000000.parquet").samefile(output)
    # kept within the budget, but not silently: the job log says how many and why
    assert any(f"m: 10 of {len(questions)} questions are stored as errors (within max_error_share=0.2" in r.message
               and "first error: HTTP 400" in r.message for r in caplog.records)


def test_a_fatal_backend_error_stops_at_once_and_keeps_answered_rows(prepared, tmp_path):
    base, questions = prepared
    output = tmp_path / "out.parquet"
    with pytest.raises(FatalBackendError, match="401"):
        _run(base, output, {"backend": "test_shard_integrity:ScriptedModel", "fatal_after": 3})
    assert not output.exists()
    calls = suite_calls(suite_order(questions).image.tolist(), 8)  # whole images, at most 8 rows a call
    first_three = {q for call in calls[:3] for q in suite_order(questions).question_id.iloc[list(call)]}
    stored = _stored_rows(output)  # the three calls answered before the error were flushed
    assert set(stored.question_id) == first_three and len(stored) == len(first_three)


def test_transient_failures_are_not_stored_and_a_rerun_asks_them(prepared, tmp_path, caplog):
    base, questions = prepared
    output = tmp_path / "out.parquet"
    settings = {"backend": "test_shard_integrity:ScriptedModel", "transient": list(questions.question_id[:3]),
                "fail": list(questions.question_id[3:5])}
    with caplog.at_level(logging.WARNING, logger="verbmirage.inference.runs"), \
            pytest.raises(IncompleteShardError, match="3 questions failed transiently"):
        _run(base, output, settings, max_error_share=0.5)
    assert not output.exists()
    stored = _stored_rows(output)
    assert len(stored) == len(questions) - 3 and stored.error.notna().sum() == 2
    # the log counts the stored error rows, not the transient failures (they count against the budget only)
    assert any(f"m: 2 of {len(questions)} questions are stored as errors" in r.message for r in caplog.records)


def test_fingerprint_covers_condition_and_weights(prepared, tmp_path):
    base, questions = prepared
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_bytes(b"a" * 10)
    model = {"backend": "llava", "path": str(weights)}

    def current(condition=None):
        return fingerprint(questions, run_settings(model, {}, condition, 8))

    reference = current({"type": "saltpepper", "probability": 0.75})
    assert current({"type": "saltpepper", "probability": 0.5}) != reference
    (weights / "model.safetensors").write_bytes(b"b" * 11)  # weights rebuilt at the same path
    assert current({"type": "saltpepper", "probability": 0.75}) != reference
    model["revision"] = "abc123"
    assert fingerprint(questions, run_settings(model, {}, None, 8)) != fingerprint(
        questions, run_settings({**model, "revision": "def456"}, {}, None, 8))


class ImageModel(ScriptedModel):
    """Answers from the question id and the bytes of its image: another image, another answer."""

    backend = "test_shard_integrity:ImageModel"

    def _score_yes_no(self, questions):
        results = []
        for q in questions:
            self.asked.append(q.question_id)
            p = (zlib.crc32(q.question_id.encode() + Path(q.image).read_bytes()) % 100) / 100
            results.append(YesNoResult(p, YES if p >= 0.5 else NO, "x", 1.0, "test"))
        return results


@pytest.mark.parametrize("condition", [{"type": "clean"}, {"type": "saltpepper", "probability": 0.5}])
def test_a_changed_image_reasks_exactly_its_questions(prepared, demo_roots, tmp_path, caplog, condition):
    """An image replaced under its old name, size and dates: the image stage runs again (its identity sees
    the change: tests/fast/test_data_identity.py), and the inference job re-asks the questions on that image, no
    others, ending with the table a fresh run writes."""
    _, questions = prepared
    root = tmp_path / "hico"
    shutil.copytree(demo_roots[0] / "images", root / "images")
    images = sorted(set(questions.image))
    write_table(questions, tmp_path / "yn_obj.parquet", QUESTIONS)
    versions = ContentVersions(tmp_path / "cache")

    def answer(output, images_dir):
        apply_condition(root, images, images_dir, "c", condition, digest=versions.digest)
        model = ImageModel("m")
        with caplog.at_level(logging.INFO):
            frame = predict(questions, model, ImageResolver(images_dir), batch_size=8,
                            store=PartStore(output, "f"), part_size=24)
        return model.asked, frame

    asked, before = answer(tmp_path / "parts", tmp_path / "images")
    assert sorted(asked) == sorted(questions.question_id)
    assert before.image_sha256.notna().all()
    changed = images[3]
    path = root / changed
    stat = path.stat()
    with Image.open(path) as old:  # other pixels, saved to the same size and dates
        other = Image.new("RGB", old.size, (200, 30, 30))
    data = io.BytesIO()
    other.save(data, format="JPEG")
    path.write_bytes(data.getvalue()[:stat.st_size].ljust(stat.st_size, b"\0"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    caplog.clear()
    asked, after = answer(tmp_path / "parts", tmp_path / "images")
    on_changed = set(questions.question_id[questions.image.eq(changed)])
    assert on_changed and set(asked) == on_changed and len(asked) == len(on_changed)
    assert f"asking {len(on_changed)} questions again whose image has changed" in caplog.text
    unchanged = ~after.question_id.isin(on_changed)
    pd.testing.assert_frame_equal(after[unchanged], before[unchanged])
    assert (after.image_sha256[~unchanged] != before.image_sha256[~unchanged]).all()
    _, fresh = answer(tmp_path / "fresh", tmp_path / "fresh_images")
    pd.testing.assert_frame_equal(after, fresh)


def test_sigterm_flushes_answered_rows_and_says_so(prepared, tmp_path):
    base, questions = prepared
    output = tmp_path / "killed.parquet"
    command = [
        sys.executable, "-m", "verbmirage", "predict", "--questions", str(base / "yn_obj.parquet"),
        "--images", str(base / "clean"), "--model-name", "slow",
        "--model", json.dumps({"backend": "slow_backend:SlowModel", "seconds_per_batch": 0.05}),
        "--output", str(output), "--batch-size", "4", "--part-size", "1000",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parts = parts_directory(output)
    # SIGTERM as soon as the progress bar counts answered rows: some batches answered, none stored yet
    # (part_size 1000), and most still to ask (a fixed sleep here once raced a slow start or a fast machine)
    seen, deadline = b"", time.monotonic() + 120
    while not re.search(rb"\b[1-9]\d*/%d\b" % len(questions), seen):
        assert process.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")[-2000:]
        if select.select([process.stderr], [], [], 1.0)[0]:
            seen += os.read(process.stderr.fileno(), 65536)
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=60)
    stderr = (seen + rest).decode(errors="replace")
    assert process.returncode != 0
    assert "terminated by SIGTERM" in stderr and "answered rows are saved" in stderr
    assert not output.exists()
    saved = pd.concat([pd.read_parquet(p) for p in parts.glob("part-*.parquet")])
    assert 0 < len(saved) < len(questions)


def test_tables_get_the_umask_and_leave_no_temporary_files(tmp_path):
    frame = pd.DataFrame({"question_id": ["q"], "raw_answer": ["yes"], "prediction": ["yes"], "parse_rule": ["t"],
                          "p_yes": [1.0], "option_probs": [None], "confidence": [1.0], "error": [None]})
    stale = tmp_path / ".out.parquet.abc123.tmp"
    stale.write_bytes(b"left by a killed writer")
    previous = os.umask(0o022)
    try:
        write_table(frame, tmp_path / "out.parquet", PREDICTIONS)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "out.parquet").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]
    with pytest.raises(FileExistsError):
        write_table(frame, tmp_path / "out.parquet", PREDICTIONS, exclusive=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]
    assert read_table(tmp_path / "out.parquet", PREDICTIONS).question_id.tolist() == ["q"]


@pytest.mark.parametrize("pixels_over_limit", [1.5, 3.0])  # Pillow warns between 1x and 2x its limit, raises above
def test_an_oversized_image_is_a_value_error_naming_the_file(tmp_path, monkeypatch, pixels_over_limit):
    """Probe 8: a decompression bomb must become one error row (ValueError), not a crashed job."""
    from PIL import Image

    from verbmirage.core.imaging import open_rgb

    path = tmp_path / "huge.png"
    Image.new("RGB", (100, 100)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", int(100 * 100 / pixels_over_limit))
    with pytest.raises(ValueError, match=r"huge.png: image too large to open safely"):
        open_rgb(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100 * 100)
    assert open_rgb(path).size == (100, 100)


class LoadedElsewhere(ScriptedModel):
    """A backend whose answers depend on what it loaded (as remote-code adapters report their environment)."""

    backend = "test_shard_integrity:LoadedElsewhere"
    environment = "torch 2.13"

    def fingerprint_extra(self):
        return {"environment": LoadedElsewhere.environment}


def test_parts_from_another_loaded_environment_are_not_reused(prepared, tmp_path, monkeypatch, caplog):
    base, questions = prepared
    output = tmp_path / "out.parquet"
    settings = {"backend": "test_shard_integrity:LoadedElsewhere", "transient": list(questions.question_id[:1])}
    with pytest.raises(IncompleteShardError):
        _run(base, output, settings)
    assert len(_stored_rows(output)) == len(questions) - 1
    with caplog.at_level(logging.INFO), pytest.raises(IncompleteShardError):
        _run(base, output, settings)  # same environment: resumed
    assert f"resuming: {len(questions) - 1} of {len(questions)}" in caplog.text
    caplog.clear()
    monkeypatch.setattr(LoadedElsewhere, "environment", "torch 2.14")
    with caplog.at_level(logging.INFO), pytest.raises(IncompleteShardError):
        _run(base, output, settings)
    assert "discarding" in caplog.text and "parts made with other settings" in caplog.text
    assert "resuming" not in caplog.text


def test_a_damaged_shard_table_names_its_folder_and_the_forced_rerun_repairs_it(prepared, tmp_path, caplog):
    """A table inside a suite job's output folder, cut short: the merge names the folder and `snakemake -R` on it;
    that rerun (Snakemake removes the folder first, then runs the job) gives the undamaged merge again."""
    base, questions = prepared
    shards = [tmp_path / "shards" / str(shard) for shard in range(2)]

    def run(shard):
        spec = RunSpec("coin", {"backend": "random"}, base / "clean", shard=shard, n_shards=2, part_size=24)
        run_suite({"yn_obj": base / "yn_obj.parquet"}, shards[shard], spec)

    for shard in range(2):
        run(shard)
    undamaged = merge_suite_shards(questions, shards, "yn_obj")
    os.truncate(shards[0] / "yn_obj.parquet", 300)
    with pytest.raises(DamagedShardError) as raised:
        merge_suite_shards(questions, shards, "yn_obj")
    message = str(raised.value)
    assert message.startswith(f"{shards[0] / 'yn_obj.parquet'}: not a readable Parquet table")
    assert f"rebuild the folder with `snakemake -R {shards[0]}`" in message and "delete it" not in message
    with pytest.raises(DamagedShardError, match=rf"`snakemake -R {shards[0]}`"):
        shard_provenance(shards[0], "yn_obj")  # what the merged table is stamped with: read first
    (shards[0] / "yn_obj.parquet").unlink()  # deleting the table alone: the merge still names the folder
    with pytest.raises(DamagedShardError, match=rf"yn_obj.parquet: missing\. .* `snakemake -R {shards[0]}`"):
        merge_suite_shards(questions, shards, "yn_obj")

    shutil.rmtree(shards[0])  # what `snakemake -R <folder>` does before it runs the job again
    with caplog.at_level(logging.WARNING):
        run(0)
    assert "part-000000.parquet: unreadable part" in caplog.text  # the kept answers were the same file
    pd.testing.assert_frame_equal(merge_suite_shards(questions, shards, "yn_obj"), undamaged)


def test_compiled_code_that_fails_during_a_job_is_named_with_its_answers(prepared, tmp_path, monkeypatch, caplog):
    """Where compiled code fails during a job (it runs otherwise from then on: ``compile_failed`` in the model's
    ``device_path``), the batching record kept with its answers, and so the table's provenance, name it; its note
    says that answers differ before and after only where some were stored before it; a resume on a process where
    nothing failed yet keeps the record as it is."""
    from verbmirage.core.io import read_provenance
    from verbmirage.inference.runs import suite_table
    from verbmirage.inference.sizing import GIB
    from verbmirage.models.baselines import RandomGuess
    from verbmirage.models.memory import MemoryCosts

    base, _ = prepared
    h200 = {"gpu": "NVIDIA H200", "capability": "9.0", "attention": "flex", "compiled_layers": True}
    failed = {**h200, "compile_failed": ["FlexAttention over the shared prefixes"]}
    costs = MemoryCosts(weights=GIB, per_row=GIB // 64, per_image=GIB // 64, device="cuda:0")
    monkeypatch.setattr(RandomGuess, "memory_costs", lambda self: costs)
    spec = RunSpec("coin", {"backend": "random"}, base / "clean", part_size=24)

    def run(output, paths: list[dict]):
        sequence = iter(paths)  # the batch's sizing, then each part's check; the last repeats
        monkeypatch.setattr(RandomGuess, "device_path", lambda self: next(sequence, paths[-1]))
        run_suite({"yn_obj": base / "yn_obj.parquet"}, output, spec, memory=lambda: (40 * GIB, 80 * GIB))
        return read_provenance(suite_table(output, "yn_obj"))["batching"]

    with caplog.at_level(logging.WARNING):
        late = run(tmp_path / "late", [h200, h200, failed])  # after the first part
    assert late["device"] == failed
    assert f"compiled code failed during the run that answered these questions ({failed['compile_failed'][0]}) " \
           "after some of them were stored" in late["note"] and late["note"] in caplog.text
    early = run(tmp_path / "early", [h200, failed])  # before any answer was stored: all computed alike
    assert early["device"] == failed and "note" not in early
    assert run(tmp_path / "late", [h200]) == late  # a resume where nothing failed yet: no new note
