"""Helpers for the tasks extension's clients (fastmcp with fastmcp-tasks): the real binary on a
free loopback port, from tests/shared/real_binary.py (standard library only)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "shared"))
from real_binary import (  # noqa: E402, F401 (re-exported to the tests)
    BINARY, CALL_TIMEOUT, INIT_TIMEOUT, SHARED_CACHE, http_server, zygote_services_stopped_after,
)


@pytest.fixture(scope="session", autouse=True)
def zygote_services_stopped():
    """Every zygote service the run's fronts started ends with the run, even when a test
    failed."""
    with zygote_services_stopped_after():
        yield


@pytest.fixture(scope="session")
def anyio_backend():
    return "asyncio"
