"""Saving blocks of a type the server has not registered yet, from many places at once.

On a fresh server, flow runs that start together each register the block types of their
parameters; before, every one but the first could fail with Prefect's ``ObjectAlreadyExists``
(it read no type, then found one made meanwhile), and `tests/reliability/test_spend_attempts.py`
failed whenever it ran alone. A real Prefect server is the judge.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from prefect_ito.blocks import ItoBooking, ItoCredentials, ItoSpendAuthorization

BLOCKS = {
    ItoSpendAuthorization: {"authorization_id": "sa_0123456789abcdef"},
    ItoBooking: {
        "booking_id": "bk-h200-2x8-ib",
        "gpu_sku": "H200",
        "node_count": 2,
        "gpus_per_node": 8,
        "fabric": "InfiniBand",
    },
    ItoCredentials: {"api_url": "https://desk.example.com"},
}


@pytest.mark.parametrize("block", list(BLOCKS), ids=lambda block: block.__name__)
async def test_blocks_of_a_new_type_saved_at_once_are_all_saved(prefect_server, block):
    # A type of the same code under a slug no server has seen: as on a fresh server.
    slug = f"ito-race-{uuid.uuid4().hex[:12]}"
    fresh = type(block.__name__, (block,), {"_block_type_slug": slug, "_block_type_name": slug})

    saved = await asyncio.gather(
        *(fresh(**BLOCKS[block]).asave(f"race-{n}", overwrite=True) for n in range(8)),
        return_exceptions=True,
    )

    assert [s for s in saved if isinstance(s, BaseException)] == []
    assert len(set(saved)) == 8
