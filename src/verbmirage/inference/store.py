"""Where a job's answers wait until its table is written: numbered Parquet parts under one writer's lock,
fingerprinted by everything the answers depend on (:func:`fingerprint`), and the table written from them
row group by row group (:func:`_stream_table`). The guarantees are listed in :mod:`verbmirage.inference.runs`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verbmirage import __version__
from verbmirage.core.io import read_table, to_arrow, write_table
from verbmirage.core.locks import BusyError, WriterLock
from verbmirage.core.paths import atomic_path, file_digest, fsync_directory
from verbmirage.core.schemas import PREDICTIONS

log = logging.getLogger(__name__)


FINGERPRINT = "fingerprint.json"


LOCK = ".lock"


class ShardBusyError(BusyError):
    """Another job holds the lock of this shard's parts folder (the message names its pid and host)."""


def fingerprint(questions: pd.DataFrame, settings: dict) -> str:
    """What the answers of a shard depend on: its question ids and ``settings``.

    ``settings`` holds everything else that changes an answer but the images: the model entry, the identity
    of its weights (:func:`model_identity`), the variant and the condition settings (:func:`run_settings`).
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for question_id in questions.question_id:
        digest.update(question_id.encode())
    return digest.hexdigest()


# Files of a checkpoint folder whose content is hashed; weights are identified by size and mtime
# (hashing gigabytes per job would cost minutes; a rebuilt or replaced weight file changes both).
_HASHED_SUFFIXES = {".json", ".py", ".txt", ".model", ".tiktoken", ".jinja"}


def model_identity(settings: dict) -> dict:
    """The weights and code a model entry loads: its ``revision``, and for a local folder its files
    (and those of its LoRA ``adapter`` folder, when it sets one).

    Rebuilding weights at the same ``path`` (or ``adapter``) or moving ``revision`` changes the
    identity, so answers computed from the old weights are not resumed.
    """
    identity = {"revision": settings.get("revision")}
    path = settings.get("path")
    if path and Path(path).is_dir():
        identity["files"] = _folder_files(path)
    adapter = settings.get("adapter")
    if adapter and Path(adapter).is_dir():  # only then: entries without an adapter keep their fingerprint
        identity["adapter_files"] = _folder_files(adapter)
    return identity


def _folder_files(path: str | Path) -> dict[str, str]:
    """File name -> content digest (small text files) or size:mtime (weights) of a checkpoint folder."""
    files = {}
    for file in sorted(Path(path).rglob("*")):
        if not file.is_file() or any(part.startswith(".") for part in file.relative_to(path).parts):
            continue
        name = file.relative_to(path).as_posix()
        stat = file.stat()
        if file.suffix in _HASHED_SUFFIXES and stat.st_size < 1 << 24:
            files[name] = file_digest(file)
        else:
            files[name] = f"{stat.st_size}:{stat.st_mtime_ns}"
    return files


def run_settings(model_settings: dict, variant_settings: dict, condition_settings: dict | None,
                 continue_tokens: int) -> dict:
    """Every setting a shard's answers depend on, besides the questions (see :func:`fingerprint`) and the
    images: each stored answer carries the digest of its image, checked on a resume one question at a time."""
    return {
        "model": model_settings,
        "weights": model_identity(model_settings),
        "variant": variant_settings,
        "condition": condition_settings,
        "continue_tokens": continue_tokens,
        "code": scoring_code_digest(),
    }


def scoring_code_digest() -> str:
    """Digest of the code that turns a question into an answer (``models/``, ``variants/``, ``inference/``,
    image reading).

    Finished suite jobs keep their answers for reuse (:meth:`PartStore.keep_only`); a change of this
    code must not reuse them, and Snakemake does not see package edits.
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    code = [path for folder in ("models", "variants", "inference") for path in (package / folder).rglob("*.py")]
    for path in sorted([*code, package / "core" / "imaging.py"]):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class PartStore:
    """Prediction rows of one shard, appended as numbered Parquet parts, with one writer at a time.

    Creating a store takes an exclusive, non-blocking ``flock`` on the folder's
    lock file and keeps it until :meth:`close` or :meth:`clear`; the lock dies
    with the process, so a killed job never leaves it behind.
    """

    def __init__(self, directory: str | Path, fingerprint: str | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = self._acquire_lock()
        for leftover in self.directory.glob(".*.tmp"):  # a write cut off by a kill
            leftover.unlink()
        if fingerprint is not None:
            self.use_fingerprint(fingerprint)

    def use_fingerprint(self, fingerprint: str) -> None:
        """Keep the parts only if they were made with ``fingerprint``; otherwise start afresh under it.

        Separate from the constructor so a job can take the lock at once and
        fingerprint what it learns while loading the model (code, environment).
        """
        stamp = self.directory / FINGERPRINT
        previous = self._read_stamp(stamp)
        if previous != fingerprint:
            parts = self._parts()
            if parts:
                log.warning("%s: discarding %d parts made with other settings", self.directory, len(parts))
            self._remove_parts()
            with atomic_path(stamp) as tmp:
                tmp.write_text(json.dumps({"fingerprint": fingerprint}))

    @property
    def batching(self) -> dict | None:
        """The batch and call sizes these parts were asked with (:mod:`verbmirage.inference.sizing`), kept beside
        their fingerprint (a new fingerprint drops them with the parts); None where none were kept."""
        try:
            kept = json.loads((self.directory / FINGERPRINT).read_text()).get("batching")
        except (OSError, ValueError, AttributeError):
            return None
        return kept if isinstance(kept, dict) else None

    def keep_batching(self, record: dict) -> None:
        """Keep ``record`` (the job's batch and call sizes) with the parts, for a resume to reuse."""
        stamp = self.directory / FINGERPRINT
        with atomic_path(stamp) as tmp:
            tmp.write_text(json.dumps({"fingerprint": self._read_stamp(stamp), "batching": record}, sort_keys=True))

    def _acquire_lock(self) -> WriterLock:
        return WriterLock(self.directory / LOCK, str(self.directory), ShardBusyError, this="this shard")

    @staticmethod
    def _read_stamp(stamp: Path) -> str | None:
        if not stamp.exists():
            return None
        try:
            return json.loads(stamp.read_text())["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("%s: unreadable fingerprint (%s: %s); removing it and the parts it covered",
                        stamp, type(error).__name__, error)
            return None

    def _parts(self) -> list[Path]:
        """The parts in the order they were written (by number, not by name: numbers may outgrow the padding)."""
        parts = [p for p in self.directory.glob("part-*.parquet") if p.stem.split("-", 1)[1].isdigit()]
        return sorted(parts, key=self._number)

    @staticmethod
    def _number(part: Path) -> int:
        return int(part.stem.split("-", 1)[1])

    def rows(self, columns: list[str] | None = None) -> pd.DataFrame:
        """Every stored row, the latest answer of a question winning; unreadable parts are removed.

        ``columns`` (``question_id`` among them) reads only those: a resume needs ids and errors, not
        every row's probabilities.
        """
        frames = []
        for part in self._parts():
            try:
                frame = read_table(part, PREDICTIONS) if columns is None else self._read_columns(part, columns)
                frames.append(frame)
            except Exception as error:  # noqa: BLE001  (any damage: truncated, empty, not Parquet, wrong schema)
                log.warning("%s: unreadable part (%s: %s); removing it, its questions will be asked again",
                            part, type(error).__name__, str(error)[:200])
                part.unlink()
        if not frames:
            return pd.DataFrame(columns=PREDICTIONS.names if columns is None else columns)
        frame = pd.concat(frames, ignore_index=True)
        return frame.drop_duplicates("question_id", keep="last").reset_index(drop=True)

    @staticmethod
    def _read_columns(part: Path, columns: list[str]) -> pd.DataFrame:
        """Some columns of a part, checked like the whole part (a damaged part raises here); one part at a time."""
        return read_table(part, PREDICTIONS)[columns]

    def keep_only(self, table: Path) -> None:
        """Replace the parts by ``table`` (the complete answers, hard-linked: no copy) and release the lock.

        The folder and its fingerprint stay, so a later run with the same settings and questions asks
        nothing again (adding a question set to a job re-asks only the new set).
        """
        self._remove_parts()
        os.link(table, self.directory / "part-000000.parquet")
        fsync_directory(self.directory)
        self.close()

    def append(self, rows: list[dict]) -> None:
        """Publish ``rows`` as a new part numbered one past the highest; never overwrites a part."""
        if not rows:
            return
        parts = self._parts()
        number = self._number(parts[-1]) + 1 if parts else 0
        path = self.directory / f"part-{number:06d}.parquet"
        write_table(pd.DataFrame(rows), path, PREDICTIONS, exclusive=True)

    def _remove_parts(self) -> None:
        for path in self._parts():
            path.unlink()

    def close(self) -> None:
        """Release the lock (the parts stay for a resume)."""
        if self._lock is not None:
            self._lock.release()

    def clear(self) -> None:
        """Remove the folder once its rows are safely in the shard output; releases the lock."""
        self._remove_parts()
        for name in (FINGERPRINT, LOCK):
            (self.directory / name).unlink(missing_ok=True)
        self.close()
        try:
            self.directory.rmdir()
        except OSError as error:  # something we did not create is inside: leave it
            log.warning("%s: not removed (%s)", self.directory, error)


def parts_directory(output: str | Path) -> Path:
    """Where the parts of a shard output live while it is being computed."""
    output = Path(output)
    return output.with_name(output.name + ".parts")


def _latest_part_of(store: PartStore, questions: pd.DataFrame) -> tuple[list[Path], dict[str, int]]:
    """The store's parts and, per question of ``questions``, the index of the part with its latest answer."""
    parts = store._parts()
    wanted, owner = set(questions.question_id), {}
    for index, part in enumerate(parts):
        for question_id in pq.read_table(part, columns=["question_id"]).column(0).to_pylist():
            if question_id in wanted:
                owner[question_id] = index
    return parts, owner


def _stream_table(parts: list[Path], owner: dict[str, int], path: Path, provenance: dict, rows_per_group: int) -> None:
    """Write the rows ``owner`` picks from ``parts`` to ``path`` part by part (never all rows in memory).

    Written like :func:`verbmirage.core.io.write_table` (atomic, schema checked, provenance metadata),
    which takes a whole frame; hence this streaming twin. Row groups hold ``rows_per_group`` rows whatever
    the parts were, so the file's bytes depend on its rows only: a table resumed from more parts (a job
    killed and run again) is the same file as an uninterrupted job's.
    """
    if isinstance(rows_per_group, bool) or not isinstance(rows_per_group, int) or rows_per_group < 1:
        raise ValueError(f"{path}: rows_per_group {rows_per_group!r} is not a whole number >= 1 (inference.part_size)")
    metadata = {b"verbmirage.version": __version__.encode(),
                b"verbmirage.provenance": json.dumps(provenance, sort_keys=True, default=str).encode()}
    schema = PREDICTIONS.with_metadata(metadata)
    waiting: list = []  # Arrow tables not yet written, fewer than rows_per_group rows in all
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for index, part in enumerate(parts):
            frame = read_table(part, PREDICTIONS)
            frame = frame[frame.question_id.map(owner).eq(index)].drop_duplicates("question_id", keep="last")
            if len(frame):
                waiting.append(to_arrow(frame, PREDICTIONS, str(part)).replace_schema_metadata(metadata))
            pending = pa.concat_tables(waiting) if waiting else None
            while pending is not None and pending.num_rows >= rows_per_group:
                writer.write_table(pending.slice(0, rows_per_group))
                pending = pending.slice(rows_per_group)
            waiting = [pending] if pending is not None and pending.num_rows else []
        if waiting:
            writer.write_table(pa.concat_tables(waiting))
        if not owner:
            writer.write_table(schema.empty_table())
