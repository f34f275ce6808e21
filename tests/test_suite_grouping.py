"""The test suite's own parallel set-up (tools/test.sh, tests/conftest.py)."""

from __future__ import annotations

import os

import pytest


def test_each_file_is_one_xdist_group(request):
    """Under ``--dist loadgroup`` the group must reach the scheduler as the node-id suffix; when it does not
    (pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386) the shared demo run is silently built
    once per worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("not under pytest-xdist --dist loadgroup (tools/test.sh with workers)")
    assert request.node.nodeid.endswith("@test_suite_grouping.py"), request.node.nodeid
