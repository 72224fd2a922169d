"""A ``PREFECT_HOME`` whose SQLite database is already migrated, for the servers the tests start.

A Prefect server on a new home migrates its database before it answers: about 6 s of CPU and of
waiting on this 2-core machine, for every session server, crash-trial stack and temporary server
of the CLI tests. The run migrates one database once (under a lock: pytest-xdist's workers share
the run's directory) and each new home gets a copy. The servers still run their migrations on
start; they find nothing left to do. Tests about a brand-new home (the first ``train``, the demo)
do not use this.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

MIGRATED_HOME = "PREFECT_ITO_TEST_MIGRATED_HOME"
"""Where the run keeps its migrated database (set by ``tests/conftest.py``; a run the suite starts
inside itself inherits it)."""
DATABASE = "prefect.db"
"""Where Prefect keeps a home's SQLite database, unless a connection URL says otherwise."""
_DATABASE_SETTINGS = (
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",  # its older name
)


def server_home(home: Path, env: dict[str, str]) -> Path:
    """Make ``home`` ready for a server started with ``env``: migrated unless ``env`` names a
    database of its own (a PostgreSQL one, migrated by that server); return ``home``."""
    if any(name in env for name in _DATABASE_SETTINGS):
        home.mkdir(parents=True, exist_ok=True)
        return home
    return migrated_home(home)


def migrated_home(home: Path) -> Path:
    """Give ``home`` a copy of the run's migrated database, unless it has one; return ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / DATABASE
    if not target.exists():
        partial = home / f".{DATABASE}.copying"
        shutil.copyfile(_template(), partial)
        partial.replace(target)  # a server started meanwhile never sees half a database
    return home


def _template() -> Path:
    """Return the run's migrated database, migrating it first if no process of the run has."""
    directory = Path(os.environ[MIGRATED_HOME])
    directory.mkdir(exist_ok=True)
    template = directory / DATABASE
    with (directory / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not template.exists():
            _migrate(directory)
    return template


def _migrate(directory: Path) -> None:
    """Migrate a new SQLite database in ``directory`` with Prefect's own command."""
    env = {k: v for k, v in os.environ.items() if k not in _DATABASE_SETTINGS}
    env["PREFECT_HOME"] = str(directory)
    subprocess.run(
        [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=300,
    )  # fmt: skip
