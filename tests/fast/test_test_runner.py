"""tools/test.sh, the README's test command: SIGTERM stops what it started, by pid, and nothing else.

It used to stop its whole process group (``kill -TERM 0``): run from another script, it killed its caller and the
caller's other children too. Here it runs one blocking test (in a folder of its own, marked fast, so the tier
selection takes it), beside a sibling process of the same group; SIGTERM to the script must end the script and the
pytest it started, and leave the sibling alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCKING_TEST = '''
import pathlib, time

def test_blocks(tmp_path):
    folder = pathlib.Path(__file__).parent
    (folder / "started").write_text(str(__import__("os").getpid()))
    deadline = time.time() + 120
    while not (folder / "release").exists() and time.time() < deadline:
        time.sleep(0.05)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
        return stat.read().split(")")[-1].split()[0] != "Z"


def _wait_for(condition, seconds: float = 60) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_sigterm_stops_what_the_script_started_and_spares_its_caller(tmp_path):
    (tmp_path / "test_block.py").write_text(BLOCKING_TEST)
    (tmp_path / "conftest.py").write_text("def pytest_collection_modifyitems(items):\n"
                                          "    for item in items:\n        item.add_marker('fast')\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    fast: the fast tier\n")
    caller = subprocess.Popen(  # one process group: the script, a sibling, their shell
        ["bash", "-c", f'sleep 300 & echo $! > {tmp_path}/sibling; '
                       f'tools/test.sh -c {tmp_path}/pytest.ini --rootdir {tmp_path} -p no:cacheprovider '
                       f'{tmp_path}/test_block.py & echo $! > {tmp_path}/script; wait'],
        cwd=REPO, env={**os.environ, "VERBMIRAGE_TEST_WORKERS": "0"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    sibling = None
    try:
        assert _wait_for(lambda: (tmp_path / "started").is_file()), "the blocking test never started"
        script, sibling = (int((tmp_path / name).read_text()) for name in ("script", "sibling"))
        pytest_pid = int((tmp_path / "started").read_text())
        os.kill(script, signal.SIGTERM)
        assert _wait_for(lambda: not _alive(script), 30), "tools/test.sh did not stop"
        assert _wait_for(lambda: not _alive(pytest_pid), 30), "the pytest it started is still running"
        assert _alive(sibling) and caller.poll() is None  # its caller and the caller's other child live on
    finally:
        (tmp_path / "release").write_text("")
        if sibling is not None and _alive(sibling):
            os.kill(sibling, signal.SIGTERM)
        caller.wait(timeout=60)
