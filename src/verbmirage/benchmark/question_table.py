"""The question table: its schema, the checks of its values (run on every read), question counts beside the
paper's, and the fixed per-model question sample (``models.<slug>.sample_questions``; docs/questions.md).
"""

from __future__ import annotations

import hashlib

import pandas as pd
import pyarrow as pa

from verbmirage.benchmark.question_sets import question_kind
from verbmirage.benchmark.questions import PAPER_COUNTS
from verbmirage.core.io import SchemaError, add_value_check
from verbmirage.core.paths import UnsafePathError, safe_relative_name
from verbmirage.data.charades import OWN_INTERVAL, SCALED_EXO

QUESTIONS = pa.schema(
    [
        ("question_id", pa.string()),
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("image_id", pa.string()),
        ("image", pa.string()),
        ("verb", pa.string()),
        ("object", pa.string()),
        ("hoi_id", pa.int64()),
        ("prompt", pa.string()),
        ("options", pa.list_(pa.string())),
        ("answer", pa.string()),
        ("group_id", pa.string()),
        ("rotation", pa.int64()),
        ("rare", pa.bool_()),
        ("common", pa.bool_()),
    ]
)


def check_questions(frame: pd.DataFrame, where: str) -> None:
    """The values a question table must hold: metrics trust these without looking again.

    ``question_id`` unique and set; ``qset`` a registered set; ``answer``
    "yes"/"no" for a yes/no set and the letter of one of the options for a
    multiple-choice set; ``image`` a safe relative path; ``rotation``, ``rare``
    and ``common`` set.
    """

    def bad(column: str, row: int, problem: str) -> SchemaError:
        return SchemaError(f"{where}: column '{column}', row {row}: {problem}")

    first_seen: dict = {}
    for row, question_id in enumerate(frame["question_id"].tolist()):  # tolist: Arrow columns convert in bulk
        if not isinstance(question_id, str):
            raise bad("question_id", row, f"missing id ({question_id!r})")
        if question_id in first_seen:
            raise bad("question_id", row, f"duplicate id {question_id!r} (first at row {first_seen[question_id]})")
        first_seen[question_id] = row
    kinds = {}
    for qset in frame["qset"].unique():
        try:
            kinds[qset] = question_kind(qset)
        except KeyError as error:
            row = int((frame["qset"] == qset).to_numpy().argmax())
            raise bad("qset", row, str(error.args[0])) from None
    for column in ("rotation", "rare", "common"):
        missing = frame[column].isna().to_numpy()
        if missing.any():
            raise bad(column, int(missing.argmax()), "missing value")
    safe_images: set = set()  # an image has many questions: its path is checked once
    for row, (qset, answer, options, image) in enumerate(
        zip(*(frame[column].tolist() for column in ("qset", "answer", "options", "image")))
    ):
        if kinds[qset] == "yn":
            if answer not in ("yes", "no"):
                raise bad("answer", row, f"{answer!r} is not 'yes' or 'no' (qset {qset})")
        else:
            count = 0 if options is None else len(options)
            letters = [chr(ord("A") + k) for k in range(min(count, 26))]
            if answer not in letters:
                raise bad("answer", row, f"{answer!r} is not the letter of one of its {count} options (qset {qset})")
        if image in safe_images:
            continue
        try:
            safe_relative_name(image, "image")
        except UnsafePathError as error:
            raise bad("image", row, str(error)) from None
        safe_images.add(image)


add_value_check(QUESTIONS, check_questions)


def question_counts(frames: dict[str, pd.DataFrame], dataset: str = "hico",
                    frame_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Our counts per question set beside the paper's (Appendix A); ``yes_share`` = yes / (yes + no).

    ``frame_table`` (CharadesEgo's, :func:`verbmirage.data.charades.frame_table`): an ego set gets the share of its
    images (frames) at the middle of the egocentric row's own interval of the action (``ego_own_interval_share``)
    and at the exo time scaled by the length ratio (``ego_scaled_exo_share``); null for every other set.
    """
    time_from = frame_table.set_index("frame_id").time_from if frame_table is not None else None
    rows = []
    for qset, frame in frames.items():
        yn = question_kind(qset) == "yn"
        unique = frame.group_id.nunique()
        paper_unique, paper_used, paper_ratio = PAPER_COUNTS.get(dataset, {}).get(qset, (None, None, ""))
        yes, no = (int((frame.answer == "yes").sum()), int((frame.answer == "no").sum())) if yn else (None, None)
        rows.append(
            {
                "dataset": dataset,
                "qset": qset,
                "rows": len(frame),
                "unique_questions": unique,
                "images": frame.image_id.nunique(),
                "yes": yes,
                "no": no,
                "yes_share": yes / (yes + no) if yn and yes + no else None,
                "paper_unique_questions": paper_unique,
                "paper_used_questions": paper_used,
                "paper_yes_to_no": paper_ratio,
                "paper_yes_share": _yes_share_of_ratio(paper_ratio),
                **_ego_time_shares(qset, frame, time_from),
            }
        )
    table = pd.DataFrame(rows)
    for column in ("yes", "no", "paper_unique_questions", "paper_used_questions"):
        table[column] = table[column].astype("Int64")
    for column in ("yes_share", "paper_yes_share", *EGO_TIME_COLUMNS):
        table[column] = table[column].astype("Float64")
    return table


#: The columns only CharadesEgo's ego sets fill (a HICO counts page leaves them out).
EGO_TIME_COLUMNS = ("ego_own_interval_share", "ego_scaled_exo_share")


def _ego_time_shares(qset: str, questions: pd.DataFrame, time_from: pd.Series | None) -> dict[str, float | None]:
    """An ego set's share of images whose time is the ego row's own interval's middle, and the scaled exo time."""
    images = questions.image_id.drop_duplicates()
    if time_from is None or not qset.endswith("_ego") or images.empty:
        return dict.fromkeys(EGO_TIME_COLUMNS)
    missing = sorted(set(images) - set(time_from.index))
    if missing:
        raise ValueError(f"{qset}: images {missing[:3]} are not in the frame table (column frame_id)")
    sources = time_from.loc[images]
    return {"ego_own_interval_share": float((sources == OWN_INTERVAL).mean()),
            "ego_scaled_exo_share": float((sources == SCALED_EXO).mean())}


def _yes_share_of_ratio(ratio: str) -> float | None:
    """"1:2" -> 1/3 (the yes share a Yes:No ratio means); "" -> None."""
    if not ratio:
        return None
    yes, no = (float(part) for part in ratio.split(":"))
    return yes / (yes + no)


def sample_settings(model_settings: dict | None) -> tuple[int, int] | None:
    """(N, seed) of a model entry's ``sample_questions`` / ``sample_seed``, or None: it asks every question."""
    settings = model_settings or {}
    count = settings.get("sample_questions")
    return (int(count), int(settings.get("sample_seed", 0))) if count else None


def question_sample(questions: pd.DataFrame, count: int, seed: int = 0) -> pd.DataFrame:
    """The questions of ``count`` groups of each set (an MC question's rotations stay together), in table order.

    A group is chosen by a hash of (seed, set, group id), not by position: the same questions whatever the
    table's order, the shard, the image condition or the variant (a condition that covers fewer images asks
    the sample's questions on them), so every run of the model answers the same questions.
    """
    if questions.empty:
        return questions
    keys = questions.qset.astype(str) + "\0" + questions.group_id.astype(str)
    ranks = keys.drop_duplicates().map(lambda key: hashlib.sha256(f"{seed}\0{key}".encode()).hexdigest())
    chosen = set(keys[ranks.index].to_frame("key").assign(rank=ranks.to_numpy(), qset=questions.qset[ranks.index])
                 .sort_values("rank").groupby("qset", sort=False).head(count).key)
    return questions[keys.isin(chosen).to_numpy()]
