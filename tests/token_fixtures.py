"""Fixtures for tests that resolve tokens: no token in the environment, a keyring in a temporary
place, a fresh simulator.

Each test directory that resolves tokens takes them in its `conftest.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyring
import pytest
from keyrings.alt.file import PlaintextKeyring

from prefect_ito.backend.memory_keyring import MemoryKeyring
from prefect_ito.backend.origins import ENV_ALLOWED_ORIGINS, ENV_API_URL, ENV_TOKEN


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test with neither the token nor the URL in the environment."""
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    monkeypatch.delenv(ENV_API_URL, raising=False)
    monkeypatch.delenv(ENV_ALLOWED_ORIGINS, raising=False)


def _use_keyring(backend: Any) -> Iterator[Any]:
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        yield backend
    finally:
        keyring.set_keyring(previous)


@pytest.fixture
def file_keyring(tmp_path: Path) -> Iterator[PlaintextKeyring]:
    """A keyrings.alt plaintext file keyring in this test's temporary directory."""
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring_pass.cfg")
    yield from _use_keyring(backend)


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    """A secure-looking in-memory keyring, accepted without the plaintext setting."""
    yield from _use_keyring(MemoryKeyring())


@pytest.fixture
def sim() -> Iterator[Any]:
    """A fresh reference simulator on a loopback port, stopped after the test."""
    from prefect_ito.simulator import SimulatorServer

    with SimulatorServer() as server:
        yield server
