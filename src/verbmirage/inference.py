"""Run one model over one question set under one image condition, sharded and resumable.

A (model, variant, condition, question set) is split into ``n`` shards by
image (:func:`select_shard`), one job each, merged afterwards
(:func:`merge_shards`). Inside a shard, answered rows are appended to
numbered Parquet parts, each written atomically (:class:`PartStore`); a job
killed at any moment resumes from its parts with no lost and no duplicated
rows. Parts carry a fingerprint of what produced them (model settings,
questions), so a changed config never reuses stale answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from verbmirage.conditions import ImageResolver
from verbmirage.io import PREDICTIONS, QUESTIONS, read_table, to_arrow, write_table
from verbmirage.models.base import MultipleChoiceResult, Question, VisionLanguageModel, YesNoResult
from verbmirage.questions import question_kind

log = logging.getLogger(__name__)
FINGERPRINT = "fingerprint.json"


def select_shard(questions: pd.DataFrame, shard: int, n_shards: int) -> pd.DataFrame:
    """Questions of shard ``shard`` (0-based) of ``n_shards``: contiguous runs of sorted images.

    All questions of an image land in one shard, so an image is read (and its
    prefix computed) by one job only.
    """
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in 0..{n_shards - 1}")
    images = sorted(questions.image.unique())
    chosen = {image for i, image in enumerate(images) if i * n_shards // len(images) == shard}
    return questions[questions.image.isin(chosen)]


def fingerprint(questions: pd.DataFrame, settings: dict) -> str:
    """What the answers of a shard depend on: its question ids and the model/variant settings."""
    digest = hashlib.sha256()
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for question_id in questions.question_id:
        digest.update(question_id.encode())
    return digest.hexdigest()


class PartStore:
    """Prediction rows of one shard, appended as atomically written numbered Parquet parts."""

    def __init__(self, directory: str | Path, fingerprint: str):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = self.directory / FINGERPRINT
        previous = json.loads(stamp.read_text())["fingerprint"] if stamp.is_file() else None
        if previous != fingerprint:
            if self._parts():
                log.warning("%s: discarding %d parts made with other settings", self.directory, len(self._parts()))
            self.clear()
            self.directory.mkdir(parents=True, exist_ok=True)
            stamp.write_text(json.dumps({"fingerprint": fingerprint}))
        for leftover in self.directory.glob(".*.tmp"):  # a write cut off by a kill
            leftover.unlink()

    def _parts(self) -> list[Path]:
        return sorted(self.directory.glob("part-*.parquet"))

    def rows(self) -> pd.DataFrame:
        parts = [pd.read_parquet(p) for p in self._parts()]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=PREDICTIONS.names)

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        number = len(self._parts())
        write_table(pd.DataFrame(rows), self.directory / f"part-{number:06d}.parquet", PREDICTIONS)

    def clear(self) -> None:
        if self.directory.exists():
            for path in self.directory.iterdir():
                path.unlink()
            self.directory.rmdir()


def _to_question(row, resolver: ImageResolver | None) -> tuple[Question, str | None]:
    """A table row -> a backend Question; an unresolvable image becomes an error string."""
    image, error = None, None
    if resolver is not None:
        try:
            image = resolver.path(row.image)
        except FileNotFoundError as missing:
            error = str(missing)
    question = Question(
        question_id=row.question_id,
        prompt=row.prompt,
        image=image,
        options=tuple(row.options) if row.options is not None else (),
        verb=None if pd.isna(row.verb) else row.verb,
        object=None if pd.isna(row.object) else row.object,
    )
    return question, error


def _error_row(question_id: str, error: str) -> dict:
    return {
        "question_id": question_id,
        "raw_answer": None,
        "prediction": "unknown",
        "parse_rule": "error",
        "p_yes": None,
        "option_probs": None,
        "confidence": None,
        "error": error,
    }


def _result_row(question_id: str, result: YesNoResult | MultipleChoiceResult) -> dict:
    row = asdict(result)
    if isinstance(result, YesNoResult):
        row["option_probs"] = None
    else:
        row["option_probs"] = list(row["option_probs"])
        row["p_yes"] = None
    return {"question_id": question_id, **row}


def _in_question_order(frame: pd.DataFrame, questions: pd.DataFrame) -> pd.DataFrame:
    order = {qid: i for i, qid in enumerate(questions.question_id)}
    return frame.sort_values("question_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


def predict(
    questions: pd.DataFrame,
    model: VisionLanguageModel,
    resolver: ImageResolver | None,
    batch_size: int = 16,
    store: PartStore | None = None,
    part_size: int = 512,
) -> pd.DataFrame:
    """One prediction row per question (schema ``verbmirage.io.PREDICTIONS``), in question order.

    Questions whose image cannot be found get an ``error`` and the run goes
    on. With a ``store``, rows already in it are not asked again and new rows
    are appended every ``part_size`` questions.
    """
    if questions.empty:
        raise ValueError("no questions to score")
    kinds = {question_kind(q) for q in questions.qset.unique()}
    if len(kinds) != 1:
        raise ValueError(f"one question kind per call, got {sorted(kinds)}")
    kind = kinds.pop()
    score = model.score_multiple_choice if kind == "mc" else model.score_yes_no
    done = store.rows() if store is not None else pd.DataFrame(columns=PREDICTIONS.names)
    todo = questions[~questions.question_id.isin(set(done.question_id))]
    if len(done):
        log.info("resuming: %d of %d questions already answered", len(done), len(questions))
    pending = []  # rows not yet in the store
    description = f"{model.name} {questions.qset.iloc[0]}"
    with tqdm(total=len(questions), initial=len(done), desc=description, unit="q") as progress:
        for start in range(0, len(todo), batch_size):
            batch = []
            for row in todo.iloc[start : start + batch_size].itertuples(index=False):
                question, error = _to_question(row, resolver if model.uses_images else None)
                if error is not None:
                    pending.append(_error_row(row.question_id, error))
                else:
                    batch.append(question)
            if batch:
                pending += [_result_row(q.question_id, r) for q, r in zip(batch, score(batch))]
            progress.update(min(batch_size, len(todo) - start))
            if store is not None and len(pending) >= part_size:
                store.append(pending)
                pending = []
    if store is None:
        return _in_question_order(pd.DataFrame(pending, columns=PREDICTIONS.names), questions)
    store.append(pending)
    return _in_question_order(store.rows(), questions)


def merge_shards(questions: pd.DataFrame, shards: list[pd.DataFrame], where: str = "predictions") -> pd.DataFrame:
    """The shards of one run as one table in question order; every question exactly once."""
    frame = pd.concat(shards, ignore_index=True)
    duplicated = frame.question_id[frame.question_id.duplicated()]
    if len(duplicated):
        raise ValueError(f"{where}: {len(duplicated)} questions answered twice, e.g. {duplicated.iloc[0]}")
    missing = set(questions.question_id) - set(frame.question_id)
    if missing:
        raise ValueError(f"{where}: {len(missing)} questions have no answer, e.g. {sorted(missing)[0]}")
    extra = set(frame.question_id) - set(questions.question_id)
    if extra:
        raise ValueError(f"{where}: {len(extra)} answers to unknown questions, e.g. {sorted(extra)[0]}")
    to_arrow(frame, PREDICTIONS, where)  # schema check
    return _in_question_order(frame, questions)


def parts_directory(output: str | Path) -> Path:
    """Where the parts of a shard output live while it is being computed."""
    output = Path(output)
    return output.with_name(output.name + ".parts")


def run_shard(
    questions_path: str | Path,
    images_dir: str | Path,
    model_slug: str,
    model_settings: dict,
    variant_settings: dict,
    shard: int,
    n_shards: int,
    output: str | Path,
    train_stats: str | Path | None = None,
    dataset: str = "hico",
    batch_size: int = 16,
    part_size: int = 512,
) -> pd.DataFrame:
    """Answer one shard and write it to ``output``; resumes from ``<output>.parts/`` if present."""
    from verbmirage.models import ModelContext, create_model

    questions = select_shard(read_table(questions_path, QUESTIONS), shard, n_shards)
    settings = {"model": model_settings, "variant": variant_settings}
    provenance = {**settings, "model_slug": model_slug, "shard": shard, "n_shards": n_shards}
    if questions.empty:
        frame = pd.DataFrame(columns=PREDICTIONS.names)
    else:
        model = create_model(model_slug, model_settings, ModelContext(dataset=dataset, train_stats=train_stats))
        store = PartStore(parts_directory(output), fingerprint(questions, settings))
        frame = predict(questions, model, ImageResolver(images_dir), batch_size, store, part_size)
    write_table(frame, output, PREDICTIONS, provenance=provenance)
    if not questions.empty:
        store.clear()
    return frame
