"""A credential revoked while a flow supervises: it stops at once, asks nothing more, logs none in.

The token is revoked the way ``prefect-ito logout`` does it, at the backend, while the flow
long-polls its run. The simulator's request log then shows what the flow did after: at most the
one long-poll already in flight, then one request answered 401, then nothing at all.
"""

from __future__ import annotations

import asyncio

from reliability_kit import Backend

from prefect_ito.backend.auth import resolve_token
from prefect_ito.settings import ItoSettings

RUN_PATH = "/v0/training-runs/"


async def test_a_revoked_token_stops_supervision_within_one_long_poll(
    backend, run_training, ledger
):
    # A stalled workload never ends by itself: only the revocation can stop supervision.
    target: Backend = backend("stall")
    flow = asyncio.ensure_future(run_training(target))
    while not any(e.path.startswith(RUN_PATH) and e.method == "GET" for e in target.requests()):
        assert not flow.done(), flow.result().state
        await asyncio.sleep(0.2)
    async with target.client() as client:
        await client.revoke_token()

    training = await asyncio.wait_for(flow, timeout=120)

    log = target.requests()
    revoked = next(i for i, e in enumerate(log) if e.path == "/v0/auth/revoke")
    after = log[revoked + 1 :]
    window = ItoSettings().poll_wait_seconds
    stopped_after = (after[-1].time - log[revoked].time).total_seconds() if after else None
    logins = [e for e in log if e.path in ("/v0/auth/device", "/v0/auth/token")]
    ledger.record(
        "revocation",
        trials=1,
        faults={"token revoked mid-run": 1},
        outcomes={f"flow {training.state.name}": 1},
        measures={
            "requests after the revocation": ", ".join(str(e.status) for e in after),
            "supervision stopped after the revocation": f"{stopped_after:.2f} s "
            f"(long-poll window {window:g} s)",
            "logins started": str(len(logins)),
        },
    )
    assert training.state.name == "Unauthenticated", training.state.message
    assert "TOKEN_REVOKED" in (training.state.message or "")
    # At most the request already in flight, then the one that met the revocation: nothing more.
    assert [e.status for e in after][-1:] == [401] and len(after) <= 2
    assert all(e.status == 200 for e in after[:-1])
    assert logins == []
    # Nothing logged anyone in: the keyring still holds the revoked token, and only that.
    assert resolve_token(target.url).get_secret_value() == target.token.get_secret_value()
    assert target.sim.runs()[0].run.state.value == "running"  # the backend run was left alone
