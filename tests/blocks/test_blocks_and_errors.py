"""The blocks against Prefect's standard suite; the error tree's shape and pickling."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import SecretStr

from prefect_ito import exceptions as exc
from prefect_ito.backend.auth import ENV_API_URL, ENV_TOKEN, store_token
from prefect_ito.backend.memory_keyring import MemoryKeyring
from prefect_ito.blocks import ItoBooking, ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import CheckpointRef, PendingAction


class TestItoCredentialsStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ItoCredentials


class TestItoBookingStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ItoBooking


class TestItoSpendAuthorizationStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ItoSpendAuthorization


def test_a_standing_authorization_block_only_names_one_at_the_backend() -> None:
    named = ItoSpendAuthorization(authorization_id="sa_0123456789abcdef")

    assert named.label == "sa_0123456789abcdef"
    assert set(ItoSpendAuthorization.model_fields) == {"authorization_id"}
    for bad in ("", "sa/../x", "sa 1"):
        with pytest.raises(ValueError, match="authorization_id"):
            ItoSpendAuthorization(authorization_id=bad)


def test_limits_written_in_prefect_are_refused_naming_what_to_do_instead() -> None:
    # Before (v0.3), these limits were the authorization: anyone who can write a flow run's
    # parameters or a block document could authorize any spend "on behalf of" anyone.
    inline = {
        "authorized_by": "Ada Lovelace", "max_budget_usd": 1e12, "booking_ids": ["*"],
        "expires_at": "2099-01-01T00:00:00Z",
    }  # fmt: skip
    with pytest.raises(ValueError, match="prefect-ito authorizations create"):
        ItoSpendAuthorization.model_validate(inline)
    with pytest.raises(ValueError, match="authorization_id"):
        ItoSpendAuthorization.model_validate({**inline, "authorization_id": "sa_1"})


def test_credentials_block_has_no_secret_field() -> None:
    schema = ItoCredentials.model_json_schema()
    assert schema.get("secret_fields", []) == []
    assert set(ItoCredentials.model_fields) == {"api_url", "keyring_entry", "timeout_seconds"}


async def test_get_client_resolves_the_token_from_the_keyring(
    memory_keyring: MemoryKeyring,
) -> None:
    store_token("http://127.0.0.1:9", SecretStr("kept"), keyring_entry="desk-a")
    block = ItoCredentials(api_url="http://127.0.0.1:9/", keyring_entry="desk-a")
    async with block.get_client() as client:
        assert client.base_url == "http://127.0.0.1:9"


def test_get_client_without_a_token_says_to_log_in(memory_keyring: MemoryKeyring) -> None:
    with pytest.raises(exc.NotLoggedIn, match="prefect-ito login"):
        ItoCredentials(api_url="http://127.0.0.1:9").get_client()


def test_get_client_takes_the_environment_token_without_a_keyring_entry(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_API_URL, "http://127.0.0.1:9")
    monkeypatch.setenv(ENV_TOKEN, "from-env")
    client = ItoCredentials(api_url="http://127.0.0.1:9").get_client()
    assert "from-env" not in repr(client)


@pytest.mark.parametrize(("field", "expected"), [({}, 7.0), ({"timeout_seconds": 2.5}, 2.5)])
async def test_client_timeout_is_the_block_field_else_the_setting(
    monkeypatch: pytest.MonkeyPatch, field: dict[str, float], expected: float
) -> None:
    monkeypatch.setenv(ENV_API_URL, "http://127.0.0.1:9")
    monkeypatch.setenv(ENV_TOKEN, "from-env")
    monkeypatch.setenv("PREFECT_INTEGRATIONS_ITO_REQUEST_TIMEOUT_SECONDS", "7")
    block = ItoCredentials(api_url="http://127.0.0.1:9", **field)
    async with block.get_client() as client:
        timeout = client._http.timeout
    assert (timeout.read, timeout.write, timeout.pool) == (expected, expected, expected)
    assert timeout.connect == 5.0


def test_booking_block_holds_the_handover() -> None:
    booking = ItoBooking(
        booking_id="bk-1", gpu_sku="H200", node_count=2, gpus_per_node=8, fabric="InfiniBand"
    )
    assert (booking.region, booking.node_ips, booking.ssh_user) == (None, [], None)


ACTION = PendingAction(
    action_id="act-1",
    kind="loss_spike_restart",
    stage="pretrain",
    step=1200,
    loss=9.1,
    baseline_loss=2.3,
    proposed_checkpoint=CheckpointRef(checkpoint_id="ckpt-1", step=1000),
    proposed_at=datetime(2026, 3, 2, tzinfo=UTC),
)
EVERY_ERROR = [
    exc.ItoTransportError("lost", ambiguous=False),
    exc.ItoTimeoutError("slow"),
    exc.ItoProtocolError("bad", endpoint="GET /v0/x", field="data.state"),
    exc.RateLimited("slow down", retry_after=3.0, status_code=429, request_id="r-1"),
    exc.error_from_envelope("BOOKING_BUSY", "busy", status_code=409, field="booking_id"),
    exc.ItoAPIError("new", code="NEW_CODE", status_code=418),
    exc.NotLoggedIn(api_url="http://desk"),
    exc.NotLoggedIn(api_url="http://desk", reason="no keyring"),
    exc.NoUsableKeyring("no keyring here, so…", reason="no keyring"),
    exc.InsecureKeyring("plaintext"),
    exc.GateFailed("pretrain", "mmlu", 0.41, 0.5, run_id="run-1"),
    exc.DecisionRequired(ACTION, run_id="run-1"),
    exc.RunStalled("no heartbeat", run_id="run-1"),
]


@pytest.mark.parametrize("error", EVERY_ERROR, ids=lambda e: type(e).__name__)
def test_errors_survive_pickling(error: exc.ItoError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.code, copy.__dict__) == (str(error), error.code, error.__dict__)


def test_run_outcomes_carry_their_details() -> None:
    gate = exc.GateFailed("pretrain", "mmlu", 0.41, 0.5, run_id="run-1")
    assert (gate.code, gate.stage, gate.eval_name, gate.run_id) == (
        "GATE_FAILED",
        "pretrain",
        "mmlu",
        "run-1",
    )
    assert "mmlu scored 0.41 against a threshold of 0.5" in str(gate)
    required = exc.DecisionRequired(ACTION)
    assert required.action == ACTION
    assert "act-1" in str(required)


def test_error_tree_roots() -> None:
    assert issubclass(exc.ItoTimeoutError, exc.ItoTransportError)
    assert issubclass(exc.TokenRevoked, exc.ItoAPIError)
    assert issubclass(exc.GateFailed, exc.ItoRunOutcome)
    for name in exc.__all__:
        member = getattr(exc, name)
        # ExitCode is the one public class outside the tree: the exit codes the tree states.
        assert not isinstance(member, type) or issubclass(member, exc.ItoError | exc.ExitCode)
    assert exc.__all__ == sorted(exc.__all__)
