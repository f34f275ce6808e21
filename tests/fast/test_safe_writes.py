"""Files the pipeline writes in place (locks, logs) are never written through a link planted at their name.

A lock or log opened by name follows a symbolic link; the holder's line, or the log, would then land in the
link's target, anywhere the job's user can write (a lock is emptied first: the target was truncated to 0 bytes).
"""

from __future__ import annotations

import fcntl
import os

import pytest

from verbmirage.core.joblog import job_log
from verbmirage.core.locks import WriterLock
from verbmirage.core.paths import NotAPlainFileError
from verbmirage.inference.store import LOCK, PartStore
from verbmirage.models.derived import build_lock

PRECIOUS = "precious data\n"


@pytest.fixture()
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text(PRECIOUS)
    return path


def test_a_part_store_whose_lock_is_a_link_is_refused_and_the_target_kept(tmp_path, victim):
    parts = tmp_path / "o" / "0.parts" / "yn_obj"
    parts.mkdir(parents=True)
    (parts / LOCK).symlink_to(victim)
    with pytest.raises(NotAPlainFileError, match=rf"{parts / LOCK}: a lock file is a symbolic link \(to {victim}\)"):
        PartStore(parts, "f")
    assert victim.read_text() == PRECIOUS
    assert not (parts / "fingerprint.json").exists()  # refused before anything was written


def test_a_derived_model_lock_that_is_a_link_is_refused_and_the_target_kept(tmp_path, victim):
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / ".m.lock").symlink_to(victim)
    with pytest.raises(NotAPlainFileError, match="symbolic link"), build_lock(tmp_path / "dl" / "m"):
        pass
    assert victim.read_text() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_lock_that_is_a_fifo_or_a_folder_is_refused_at_once(tmp_path, kind):
    lock = tmp_path / ".lock"
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()
    with pytest.raises(NotAPlainFileError, match=rf"{lock}: a lock file is a {'FIFO' if kind == 'fifo' else 'folder'}"):
        WriterLock(lock, "a shard")


def test_a_job_log_that_is_a_link_is_refused_and_the_target_kept(tmp_path, victim):
    log = tmp_path / "logs" / "0.log"
    log.parent.mkdir()
    log.symlink_to(victim)
    with pytest.raises(NotAPlainFileError, match="a job log is a symbolic link"), job_log(log) as logger:
        logger.info("never written")
    assert victim.read_text() == PRECIOUS


def test_a_job_log_marker_that_is_a_link_is_refused_and_never_linked_in(tmp_path, victim):
    """A planted second name (``.<log>.<pid>@<host>.writer``) linking to a file another process holds locked (as
    a running job holds its log) would be "put back" as this job's log: later jobs would append to it."""
    log = tmp_path / "logs" / "0.log"
    log.parent.mkdir()
    marker = log.parent / ".0.log.1@elsewhere.writer"
    marker.symlink_to(victim)
    with victim.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(NotAPlainFileError, match=rf"{marker}: a running job's second name of its log is a "
                                                     "symbolic link"), job_log(log):
            pass
    assert victim.read_text() == PRECIOUS
    assert not log.exists()  # not made a second name of the victim
