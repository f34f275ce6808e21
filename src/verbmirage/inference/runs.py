"""Run one model over one question set under one image condition, sharded and resumable.

A (model, variant, condition, question set) is split into ``n`` shards by
image (:func:`select_suite_shard`), one job each, merged afterwards
(:func:`merge_shards`). Inside a shard, answered rows are appended to
numbered Parquet parts (:class:`PartStore`); a job killed at any moment
resumes from its parts. The guarantees:

- Complete or loud: a shard's output is written only when it holds every
  question of the shard exactly once (:func:`check_complete`).
- Nothing overwritten: a part is published under a new number (one past the
  highest) with a hard link, so an existing part is never replaced; each part
  is fsynced before it appears.
- Damage is repaired, not fatal: an unreadable part or fingerprint is named in
  the log and removed, and its questions are asked again.
- One writer: the job holds an OS lock on its parts folder; a second job on
  the same shard fails at once (:class:`ShardBusyError`).
- Stale answers never reused: parts carry a fingerprint of the model settings
  and weights, the variant, the condition settings and the question ids
  (:func:`fingerprint`), and each answer the digest of the image it was asked
  on (``image_sha256``): a question whose image has changed since is asked
  again, and only such questions.
- Errors that matter stop the job: more than ``max_error_share`` error rows,
  or a :class:`~verbmirage.models.base.FatalBackendError` (a rejected API key),
  fail it with the reason; transient failures are not stored, so a rerun asks
  them again. SIGTERM flushes the answered rows before the job ends.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import signal
import tempfile
import threading
import zlib
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from verbmirage.benchmark.conditions import ImageResolver, condition_questions
from verbmirage.benchmark.question_sets import question_kind
from verbmirage.benchmark.question_table import QUESTIONS, question_sample, sample_settings
from verbmirage.core.io import DamagedTableError, read_table, to_arrow
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.inference.settings import INFERENCE_DEFAULTS, check_inference_settings
from verbmirage.inference.sizing import MemoryReading, choose_batching, with_compile_failures
from verbmirage.inference.store import (
    PartStore,
    _latest_part_of,
    _stream_table,
    fingerprint,
    parts_directory,
    run_settings,
)
from verbmirage.models import ModelContext, create_model
from verbmirage.models.base import (
    FatalBackendError,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    score_questions,
)
from verbmirage.models.calibrated import decision_model
from verbmirage.models.registry import backend_class, setting_problems
from verbmirage.variants.settings import Variant

log = logging.getLogger(__name__)


class IncompleteShardError(RuntimeError):
    """The shard cannot be written complete (too many errors, or questions still to ask)."""


class DamagedShardError(DamagedTableError):
    """A table inside a suite job's output folder is missing or cannot be read; the message names the folder and
    the rerun that rebuilds it."""


class JobTerminated(Exception):
    """SIGTERM arrived (SLURM preemption, scancel, Snakemake shutting down)."""


def _question_rows(frame: pd.DataFrame) -> list:
    """The rows of a question table as named tuples, read column by column: iterating Arrow-backed columns
    value by value (``itertuples``) costs several times more."""
    row = namedtuple("QuestionRow", frame.columns, rename=True)
    return [row._make(values) for values in zip(*(frame[column].tolist() for column in frame.columns))]


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


def _error_row(question_id: str, error: str, image_sha256: str | None = None) -> dict:
    return {
        "question_id": question_id,
        "raw_answer": None,
        "prediction": "unknown",
        "parse_rule": "error",
        "p_yes": None,
        "yes_margin": None,
        "yes_mass": None,
        "option_probs": None,
        "confidence": None,
        "error": error,
        "vcd_kl": None,
        "vcd_plausible": None,
        "vcd_kl_reverse": None,
        "image_sha256": image_sha256,
    }


def _result_row(question_id: str, result: YesNoResult | MultipleChoiceResult, image_sha256: str | None) -> dict:
    # a shallow copy of the fields: dataclasses.asdict deep-copies every value (a third of a blind baseline's job)
    row = {name: getattr(result, name) for name in _stored_fields(type(result))}
    if isinstance(result, YesNoResult):
        row["option_probs"] = None
    else:
        row["option_probs"] = list(row["option_probs"])
        row["p_yes"] = row["yes_margin"] = row["yes_mass"] = None
    return {"question_id": question_id, **row, "image_sha256": image_sha256}


@functools.cache
def _stored_fields(result_type: type) -> tuple[str, ...]:
    """The fields of a result class that a prediction row stores (all but ``retry``)."""
    return tuple(field.name for field in fields(result_type) if field.name != "retry")


def _in_question_order(frame: pd.DataFrame, questions: pd.DataFrame) -> pd.DataFrame:
    order = {qid: i for i, qid in enumerate(questions.question_id)}
    return frame.sort_values("question_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


@contextmanager
def _sigterm_raises():
    """Turn SIGTERM into :class:`JobTerminated` (main thread only), so ``finally`` blocks flush rows."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise JobTerminated("terminated by SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _ErrorBudget:
    """Counts error rows of a shard and fails it (:meth:`check`, after each model call) once more than
    ``max_share`` of its questions are errors.

    The count only grows, so failing at the first call that passes the limit gives the same verdict as waiting
    for the end, without spending GPU hours first. It fails between calls, not inside one, so the rows kept
    for a resume end at a call's end (see :func:`suite_calls`).
    """

    def __init__(self, total: int, max_share: float):
        self.total, self.max_share, self.count, self.stored = total, max_share, 0, 0
        self.example: str | None = None

    def warn_if_any(self, name: str) -> None:
        """Error rows within the budget are kept (they count as unknown answers): say so in the job log."""
        if self.stored:
            log.warning("%s: %d of %d questions are stored as errors (within max_error_share=%g; they count as "
                        "unknown); first error: %s. After fixing the cause, rerun the shard (snakemake -R <shard>) "
                        "to ask them again", name, self.stored, self.total, self.max_share, self.example)

    def add(self, error: str, stored: bool = True) -> None:
        """One more failed question: an error row (``stored``), or a transient failure that is not stored."""
        self.count += 1
        self.stored += stored
        self.example = self.example or error

    def check(self) -> None:
        if self.count > self.max_share * self.total:
            raise IncompleteShardError(
                f"{self.count} of {self.total} questions failed, more than max_error_share={self.max_share:g}; "
                f"first error: {self.example}"
            )


def predict(
    questions: pd.DataFrame,
    model: VisionLanguageModel,
    resolver: ImageResolver | None,
    batch_size: int | str = INFERENCE_DEFAULTS["batch_size"],
    store: PartStore | None = None,
    part_size: int = INFERENCE_DEFAULTS["part_size"],
    max_error_share: float = 1.0,
    memory: MemoryReading | None = None,
) -> pd.DataFrame:
    """One prediction row per question (schema ``verbmirage.core.schemas.PREDICTIONS``), in question order.

    A suite of one: :func:`predict_suite` with every set of ``questions`` going to ``store`` (a temporary
    one when none is given), so a single set is answered exactly as in a suite job. Questions whose image
    cannot be found get an ``error`` and the run goes on, until more than ``max_error_share`` of the
    questions have failed (:class:`IncompleteShardError`, at the end of the model call that passed the limit).
    With a ``store``, rows already in it are not asked again (stored error rows are: the cause may be fixed),
    new rows are appended every ``part_size`` rows, and whatever was answered is flushed before any exception
    (SIGTERM included) ends the call. Transient failures (``retry``) are never stored; if any remain at the end
    the call raises :class:`IncompleteShardError` so a rerun asks them again. ``batch_size`` and ``part_size``
    default to the config's (:data:`~verbmirage.inference.settings.INFERENCE_DEFAULTS`); ``max_error_share`` to
    1, no budget: called directly, every failed question is a row. ``memory``: the device's memory reading
    that sizes an ``auto`` batch (:mod:`verbmirage.inference.sizing`; default: the model's GPU, none on the CPU).
    """
    if questions.empty:
        raise ValueError("no questions to score")
    with contextlib.ExitStack() as cleanup:
        if store is None:
            store = PartStore(Path(cleanup.enter_context(tempfile.TemporaryDirectory())) / "parts")
            cleanup.callback(store.close)
        predict_suite(questions, model, resolver, dict.fromkeys(questions.qset.unique(), store),
                      batch_size=batch_size, part_size=part_size, max_error_share=max_error_share, memory=memory)
        frame = store.rows()
    return _in_question_order(frame[frame.question_id.isin(set(questions.question_id))], questions)


def check_complete(questions: pd.DataFrame, frame: pd.DataFrame, where: str = "predictions") -> None:
    """Raise unless ``frame`` answers every question of ``questions`` exactly once, and nothing else."""
    duplicated = frame.question_id[frame.question_id.duplicated()]
    if len(duplicated):
        raise IncompleteShardError(f"{where}: {len(duplicated)} questions answered twice, e.g. {duplicated.iloc[0]}")
    asked, answered = set(questions.question_id.tolist()), set(frame.question_id.tolist())  # tolist: in bulk
    missing = asked - answered
    if missing:
        raise IncompleteShardError(f"{where}: {len(missing)} questions have no answer, e.g. {sorted(missing)[0]}")
    extra = answered - asked
    if extra:
        raise IncompleteShardError(f"{where}: {len(extra)} answers to unknown questions, e.g. {sorted(extra)[0]}")


def merge_shards(questions: pd.DataFrame, shards: list[pd.DataFrame], where: str = "predictions") -> pd.DataFrame:
    """The shards of one run as one table in question order; every question exactly once."""
    frame = pd.concat(shards, ignore_index=True)
    check_complete(questions, frame, where)
    to_arrow(frame, PREDICTIONS, where)  # schema check
    return _in_question_order(frame, questions)


# ---- one job per image shard across all question sets -------------------------------------------
# A suite job answers every question set a (dataset, condition, model, variant) asks, for the images of
# one shard, image by image: an image's prefix (its image tokens) is computed once for all its questions,
# YN and MC alike. Each set has its own PartStore (``<output>.parts/<qset>/``) and its own table in the
# output folder (``<output>/<qset>.parquet``); rule merge_predictions joins a set's shards.


def asked_questions(questions: pd.DataFrame, model_settings: dict | None) -> pd.DataFrame:
    """The questions a model is asked of a set: all, or its entry's fixed sample (``sample_questions``; the
    merge and the metrics read the same sample back from the predictions' provenance)."""
    sample = sample_settings(model_settings)
    return questions if sample is None else question_sample(questions, *sample).reset_index(drop=True)


def image_shard(image: str, n_shards: int) -> int:
    """The shard of an image: a hash of its name, so adding a question set (new images) moves no image."""
    return zlib.crc32(image.encode()) % n_shards


def select_suite_shard(questions: pd.DataFrame, shard: int, n_shards: int) -> pd.DataFrame:
    """The questions (of any sets) on the images of shard ``shard`` of ``n_shards`` (:func:`image_shard`)."""
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is not in 0..{n_shards - 1}")
    return questions[questions.image.map(lambda image: image_shard(image, n_shards)) == shard]


def suite_order(questions: pd.DataFrame) -> pd.DataFrame:
    """Image-major order (every set's questions of an image together), otherwise the given order."""
    return questions.sort_values("image", kind="stable").reset_index(drop=True)


def _image_runs(images: list[str]) -> list[tuple[int, int]]:
    """(start, stop) of each run of equal values in ``images``."""
    runs, start = [], 0
    for _, run in itertools.groupby(images):
        length = sum(1 for _ in run)
        runs.append((start, start + length))
        start += length
    return runs


def suite_calls(images: list[str], per_call: int) -> list[range]:
    """Cut rows in image-major order (``images``: each row's image) into model calls of at most ``per_call``.

    A call holds whole images; an image with more rows than ``per_call`` has calls of its own. The cut is made
    over every question of the shard, answered or not, so a resumed job (whose stored parts end at call
    boundaries: rows are stored only after their call) asks its remaining questions in exactly the calls of an
    uninterrupted run. A call's answers can depend on its other rows (padding, images whose prefixes run as one
    batch), so this is what makes a resumed table bit-identical to an uninterrupted one. No image spans two
    calls with other images, so no image prefix is carried from one call into the next.
    """
    calls: list[range] = []
    first = 0  # the first row of the open call
    for image_start, image_stop in _image_runs(images):
        if image_stop - image_start > per_call:  # an image too large for one call: calls of its own
            if first < image_start:
                calls.append(range(first, image_start))
            calls += [range(row, min(row + per_call, image_stop)) for row in range(image_start, image_stop, per_call)]
            first = image_stop
        elif image_stop - first > per_call:  # the image starts the next call
            calls.append(range(first, image_start))
            first = image_start
    if first < len(images):
        calls.append(range(first, len(images)))
    return calls


def predict_suite(
    questions: pd.DataFrame,
    model: VisionLanguageModel,
    resolver: ImageResolver | None,
    stores: dict[str, PartStore],
    *,
    batch_size: int | str,
    part_size: int,
    max_error_share: float,
    memory: MemoryReading | None = None,
) -> dict[str, int]:
    """Answer the questions of several sets (column ``qset``) into each set's store; how many rows each got now.

    The guarantees of :func:`predict`, over the whole job: stored answers are not asked again (stored
    error rows are), rows reach the sets' stores whenever one set has ``part_size`` new rows (every set's
    rows at once, at the end of a call) and before any exception (SIGTERM included) ends the call, more than
    ``max_error_share`` error rows of all the questions stop it (at the end of the call that passed the limit),
    and transient failures are never stored (:class:`IncompleteShardError` at the end).
    Only a part's worth of rows per set is held in memory. The batch and call sizes are the configured
    ``batch_size``'s, or sized from ``memory`` where it is ``auto`` (:func:`~verbmirage.inference.sizing.choose_batching`);
    those kept with the stores' answers are reused, and the chosen ones kept with them.
    """
    if questions.empty:
        raise ValueError("no questions to score")
    check_inference_settings(batch_size=batch_size, part_size=part_size, max_error_share=max_error_share)
    unknown = sorted(set(questions.qset) - set(stores))
    if unknown:
        raise ValueError(f"no part store for question sets {unknown}")
    resolver = resolver if model.uses_images else None
    # the digest of each question's image as the model sees it now; an answer given on another is not kept
    image_digests = ({} if resolver is None else
                     dict(zip(questions.question_id, map(resolver.digest, questions.image.tolist()))))
    answered: set[str] = set()
    for qset, store in stores.items():
        wanted = set(questions.question_id[questions.qset.eq(qset)])
        done = store.rows(columns=["question_id", "error", "image_sha256"])
        done = done[done.question_id.isin(wanted)]
        fine = done.error.isna()
        now, then = (column.astype(object).fillna("") for column in (done.question_id.map(image_digests),
                                                                       done.image_sha256))
        stale = (now != then) & bool(image_digests)
        kept = set(done.question_id[fine & ~stale])
        if kept:
            log.info("%s: resuming: %d of %d questions already answered", qset, len(kept), len(wanted))
        if (fine & stale).any():
            log.info("%s: asking %d questions again whose image has changed since they were answered", qset,
                     int((fine & stale).sum()))
        if (~fine).any():
            log.info("%s: asking %d questions again whose stored answer was an error", qset, int((~fine).sum()))
        answered |= kept
    ordered = suite_order(questions)
    # questions per model call (a batch, or more: the model's); kept with the answers, reused on a resume
    kept = next((store.batching for store in stores.values() if store.batching is not None), None)
    batching = choose_batching(model, batch_size, kept, ordered.image.tolist(), memory)
    for store in stores.values():
        if batching.record is not None and store.batching != batching.record:
            store.keep_batching(batching.record)
    per_call = batching.per_call
    calls = suite_calls(ordered.image.tolist(), per_call)  # cut over every question: see suite_calls
    unanswered = ~ordered.question_id.isin(answered).to_numpy()
    calls = [[i for i in call if unanswered[i]] for call in calls]
    calls = [call for call in calls if call]
    question_rows = _question_rows(ordered)
    multiple_choice = [question_kind(row.qset) == "mc" for row in question_rows]
    budget = _ErrorBudget(len(questions), max_error_share)
    stored = bool(answered)  # answers stored before the ones pending (by an earlier run, or an earlier part)
    pending: dict[str, list[dict]] = {qset: [] for qset in stores}
    asked = dict.fromkeys(stores, 0)
    retry: list[str] = []

    def keep(qset: str, row: dict) -> None:
        pending[qset].append(row)
        asked[qset] += 1
        if row["error"] is not None:
            budget.add(row["error"])

    def flush(everything: bool) -> None:
        """Store the pending rows of every set once one set holds ``part_size`` (or ``everything``): stored rows
        then end at the same call in every set, so a resume asks whole calls, as an uninterrupted run does (a
        call's answers can depend on its other rows: suite_calls), and any compile failure since in the batching."""
        nonlocal batching, stored
        if not everything and max(map(len, pending.values())) < part_size:
            return
        if (now := with_compile_failures(batching, model, stored)) is not batching:
            batching = now
            for store in stores.values():
                store.keep_batching(batching.record)
        for qset, rows in pending.items():
            if rows:
                stores[qset].append(rows)
                pending[qset], stored = [], True

    description = f"{model.name} {len(stores)} sets"
    try:
        with _sigterm_raises(), tqdm(total=len(questions), initial=len(answered), desc=description, unit="q") as bar:
            for call in calls:
                batch, flags, sets = [], [], []
                for row, flag in ((question_rows[i], multiple_choice[i]) for i in call):
                    question, error = _to_question(row, resolver)
                    if error is not None:
                        keep(row.qset, _error_row(row.question_id, error, image_digests.get(row.question_id)))
                    else:
                        batch.append(question), flags.append(flag), sets.append(row.qset)
                for question, qset, result in zip(batch, sets, score_questions(model, batch, flags) if batch else []):
                    if result.retry:
                        retry.append(result.error)
                        budget.add(result.error, stored=False)
                    else:
                        keep(qset, _result_row(question.question_id, result, image_digests.get(question.question_id)))
                bar.update(len(call))
                budget.check()  # with every row of the call kept: a stop stores whole calls
                flush(everything=False)
    except (FatalBackendError, IncompleteShardError, JobTerminated, KeyboardInterrupt) as stop:
        flush(everything=True)
        log.error("%s: stopped (%s: %s); the answered rows are saved for a resume", model.name,
                  type(stop).__name__, stop)
        raise
    except BaseException:
        flush(everything=True)  # keep what was answered, whatever went wrong
        raise
    flush(everything=True)
    budget.warn_if_any(model.name)
    if retry:
        raise IncompleteShardError(
            f"{len(retry)} questions failed transiently and were not stored (first: {retry[0]}); "
            "rerun to ask them again"
        )
    return asked


def suite_table(output: str | Path, qset: str) -> Path:
    """Where a suite job's output folder holds the rows of one question set."""
    return Path(output) / f"{qset}.parquet"


@dataclass(frozen=True)
class RunSpec:
    """Everything one inference job needs besides its questions: the model, the variant, the images, the shard,
    and how to run (batch, part size, error budget, continuation). The run settings default to the config's
    ``inference`` defaults (:data:`~verbmirage.inference.settings.INFERENCE_DEFAULTS`)."""

    model_slug: str
    model_settings: dict
    images_dir: str | Path
    variant_settings: dict = field(default_factory=dict)
    shard: int = 0
    n_shards: int = 1
    dataset: str = "hico"
    train_stats: str | Path | None = None
    condition_settings: dict | None = None
    decision_input: str | Path | None = None  # a decision variant's cuts file or content-free images folder
    batch_size: int | str = INFERENCE_DEFAULTS["batch_size"]
    part_size: int = INFERENCE_DEFAULTS["part_size"]
    max_error_share: float = INFERENCE_DEFAULTS["max_error_share"]
    continue_tokens: int = INFERENCE_DEFAULTS["continue_tokens"]

    def __post_init__(self):
        """Every run setting is checked against the config's bounds, and the model entry's settings as planning
        checks them (:func:`verbmirage.models.registry.setting_problems`)."""
        check_inference_settings(batch_size=self.batch_size, part_size=self.part_size,
                                 max_error_share=self.max_error_share, continue_tokens=self.continue_tokens,
                                 shards=self.n_shards)
        problems = setting_problems(self.model_settings.get("backend", ""), self.model_settings)
        if problems:
            raise ValueError("; ".join(f"models.{self.model_slug}.{problem}" for problem in problems))

    @property
    def provenance(self) -> dict:
        return {"model": self.model_settings, "variant": self.variant_settings, "condition": self.condition_settings,
                "model_slug": self.model_slug, "shard": self.shard, "n_shards": self.n_shards}


def read_questions(questions_paths: dict[str, str | Path], spec: RunSpec) -> pd.DataFrame:
    """The questions of every set (qset -> table) that the model asks, on the spec's image shard."""
    frames = []
    for qset, path in questions_paths.items():
        table = asked_questions(read_table(path, QUESTIONS), spec.model_settings)
        if not table.qset.eq(qset).all():
            raise ValueError(f"{path}: holds question set(s) {sorted(set(table.qset))}, expected '{qset}'")
        # a partial condition (crop: single-instance images only) asks only the questions on its images
        frames.append(condition_questions(table, spec.images_dir))
    return select_suite_shard(pd.concat(frames, ignore_index=True), spec.shard, spec.n_shards)


def answer_job(questions: pd.DataFrame, stores: dict[str, PartStore], tables: dict[str, Path], spec: RunSpec,
               memory: MemoryReading | None = None) -> dict[str, int]:
    """The one inference path: load the model once, answer ``questions`` (any sets) into each set's store,
    and write each set's table (``tables``: qset -> path) once every set answers each of its questions exactly
    once; nothing is written otherwise. Returns the rows per set.

    A calibrated-decision variant decides by ``spec.decision_input``
    (:func:`verbmirage.models.calibrated.decision_model`). The finished answers stay in the stores (hard
    links), fingerprinted per set: a rerun with another list of sets asks only the sets it has no answers for.
    A table's provenance holds the job's batch and call sizes (``batching``) where they were sized or kept
    (a GPU; ``memory``: :func:`predict_suite`'s).
    """
    variant = Variant.from_config(spec.variant_settings, where=f"variants (run of {spec.model_slug})")
    settings = run_settings(spec.model_settings, variant.settings(), spec.condition_settings, spec.continue_tokens)
    model = None
    try:
        if not questions.empty:
            reads_answers = backend_class(spec.model_settings["backend"]).reads_answers
            answers = dict(zip(questions.question_id, questions.answer)) if reads_answers else None
            model = create_model(spec.model_slug, spec.model_settings,
                                 ModelContext(dataset=spec.dataset, train_stats=spec.train_stats, answers=answers))
            if model.continue_tokens is not None:  # backends that decode answers token by token
                model.continue_tokens = spec.continue_tokens
            model.use_variant(variant, where=f"models.{spec.model_slug} with this variant")
            # calibrated decisions: the model as is unless the variant sets `decision`
            model = decision_model(model, variant, dict(zip(questions.question_id, questions.qset)), spec.dataset,
                                   spec.decision_input)
            loaded = model.fingerprint_extra()
            for qset, store in stores.items():
                store.use_fingerprint(fingerprint(questions[questions.qset.eq(qset)],
                                                  {**settings, "loaded": loaded, "qset": qset}))
            predict_suite(questions, model, ImageResolver(spec.images_dir), stores, batch_size=spec.batch_size,
                          part_size=spec.part_size, max_error_share=spec.max_error_share, memory=memory)
        answers = {}  # every set checked complete before any table is written
        for qset, store in stores.items():
            wanted = questions[questions.qset.eq(qset)]
            parts, owner = _latest_part_of(store, wanted)
            check_complete(wanted, pd.DataFrame({"question_id": list(owner)}), where=f"{tables[qset]} ({qset})")
            answers[qset] = (parts, owner)
        for qset, (parts, owner) in answers.items():
            tables[qset].parent.mkdir(parents=True, exist_ok=True)
            batching = stores[qset].batching  # none on the CPU: the table as it always was
            _stream_table(parts, owner, tables[qset],
                          {**spec.provenance, "qset": qset, **({"batching": batching} if batching else {})},
                          spec.part_size)
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    finally:
        if model is not None:
            model.close()
    for qset, store in stores.items():
        store.keep_only(tables[qset])
    return {qset: len(owner) for qset, (_, owner) in answers.items()}


def run_suite(questions_paths: dict[str, str | Path], output: str | Path, spec: RunSpec,
              memory: MemoryReading | None = None) -> dict[str, int]:
    """Answer every set of ``questions_paths`` (qset -> question table) on the spec's image shard; the output
    folder gets ``<qset>.parquet`` per set (:func:`suite_table`), resumable per set from
    ``<output>.parts/<qset>/``. One model load and one prefix per image for all sets (:func:`answer_job`;
    ``memory``: its device reading)."""
    output = Path(output)
    questions = read_questions(questions_paths, spec)
    # the locks first: a second writer fails before loading a model
    stores = {qset: PartStore(parts_directory(output) / qset) for qset in questions_paths}
    return answer_job(questions, stores, {qset: suite_table(output, qset) for qset in questions_paths}, spec, memory)


def run_shard(questions_path: str | Path, output: str | Path, spec: RunSpec) -> pd.DataFrame:
    """One question set into one table ``output`` (resumable from ``<output>.parts/``): a suite of one
    (:func:`answer_job`). Returns the rows, in question order."""
    output = Path(output)
    qsets = read_table(questions_path, QUESTIONS).qset.unique()
    if len(qsets) != 1:
        raise ValueError(f"{questions_path}: one question set expected, found {sorted(qsets)}")
    questions = read_questions({qsets[0]: questions_path}, spec)
    store = PartStore(parts_directory(output))  # the lock first: a second writer fails before loading a model
    answer_job(questions, {qsets[0]: store}, {qsets[0]: output}, spec)
    return _in_question_order(read_table(output, PREDICTIONS), questions)
