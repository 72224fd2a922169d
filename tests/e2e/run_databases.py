"""PostgreSQL databases of one run of the suite, on the cluster of ``PREFECT_ITO_POSTGRES_URL``.

Every server that runs on PostgreSQL gets a database of its own, so that servers of parallel
workers never share one. Each is named ``prefect_<run>_<purpose>_<id>``: the secret sweep reads
every row of them, and the process that started the run drops them at its end (the suite's
``conftest.py``).
"""

from __future__ import annotations

import asyncio
import os
from uuid import uuid4

POSTGRES_URL = "PREFECT_ITO_POSTGRES_URL"


def new_database(url: str, purpose: str) -> str:
    """Create a fresh database on the cluster of ``url``; return its SQLAlchemy URL."""
    name = f"prefect_{os.environ['PREFECT_ITO_TEST_RUN']}_{purpose}_{uuid4().hex[:8]}"
    asyncio.run(_create(url, name))
    return f"{url.rsplit('/', 1)[0]}/{name}"


async def _create(url: str, name: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
