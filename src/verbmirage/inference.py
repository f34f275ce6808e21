"""Run one model over one question set under one image condition."""

from __future__ import annotations

import logging
from dataclasses import asdict

import pandas as pd
from tqdm import tqdm

from verbmirage.conditions import ImageResolver
from verbmirage.models.base import MultipleChoiceResult, Question, VisionLanguageModel, YesNoResult
from verbmirage.questions import question_kind

log = logging.getLogger(__name__)


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


def _error_row(question_id: str, kind: str, error: str) -> dict:
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


def predict(
    questions: pd.DataFrame,
    model: VisionLanguageModel,
    resolver: ImageResolver | None,
    batch_size: int = 16,
) -> pd.DataFrame:
    """One prediction row per question (schema ``verbmirage.io.PREDICTIONS``).

    Questions whose image cannot be found get an ``error`` and the run goes on.
    """
    if questions.empty:
        raise ValueError("no questions to score")
    kinds = {question_kind(q) for q in questions.qset.unique()}
    if len(kinds) != 1:
        raise ValueError(f"one question kind per call, got {sorted(kinds)}")
    kind = kinds.pop()
    score = model.score_multiple_choice if kind == "mc" else model.score_yes_no
    rows = []
    with tqdm(total=len(questions), desc=f"{model.name} {questions.qset.iloc[0]}", unit="q") as progress:
        for start in range(0, len(questions), batch_size):
            batch, ready = [], []
            for row in questions.iloc[start : start + batch_size].itertuples(index=False):
                question, error = _to_question(row, resolver if model.uses_images else None)
                if error is not None:
                    rows.append(_error_row(row.question_id, kind, error))
                else:
                    batch.append(question)
            for question, result in zip(batch, score(batch) if batch else []):
                ready.append(_result_row(question.question_id, result))
            rows.extend(ready)
            progress.update(min(batch_size, len(questions) - start))
    frame = pd.DataFrame(rows)
    order = {qid: i for i, qid in enumerate(questions.question_id)}
    return frame.sort_values("question_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
