"""Token and URL resolution, the keyring rules, and the device login loop."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import keyring
import pytest
from ito_fakes import Script, fail, mock_client, ok
from keyring.backend import KeyringBackend
from keyring.backends.chainer import ChainerBackend
from keyring.backends.fail import Keyring as NoKeyring
from keyring.backends.null import Keyring as NullKeyring
from keyrings.alt.file import PlaintextKeyring
from pydantic import SecretStr

from prefect_ito.backend import auth
from prefect_ito.backend.memory_keyring import MemoryKeyring
from prefect_ito.contract import DeviceAuthorization, ErrorCode, TokenGrant
from prefect_ito.exceptions import (
    AccessDenied,
    ExitCode,
    ExpiredToken,
    InsecureKeyring,
    ItoError,
    NotLoggedIn,
    NoUsableKeyring,
    TokenWithoutOrigin,
)

URL = "http://127.0.0.1:9/"
ALLOW = "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING"


def test_env_token_comes_before_the_keyring(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth.store_token(URL, SecretStr("from-keyring"))
    monkeypatch.setenv(auth.ENV_API_URL, URL)
    monkeypatch.setenv(auth.ENV_TOKEN, "from-env")
    assert auth.resolve_token(URL).get_secret_value() == "from-env"
    monkeypatch.delenv(auth.ENV_TOKEN)
    assert auth.resolve_token(URL).get_secret_value() == "from-keyring"


def test_keyring_entry_is_the_origin(memory_keyring: MemoryKeyring) -> None:
    auth.store_token("HTTP://127.0.0.1:9///", SecretStr("t"))
    assert memory_keyring.secrets == {("prefect-ito", "http://127.0.0.1:9"): "t"}
    assert auth.resolve_token("http://127.0.0.1:9").get_secret_value() == "t"
    assert auth.resolve_token("http://127.0.0.1:9/v0/anything").get_secret_value() == "t"
    with pytest.raises(NotLoggedIn):
        auth.resolve_token("http://127.0.0.1:10")


def test_a_keyring_label_is_a_second_login_at_the_same_origin(
    memory_keyring: MemoryKeyring,
) -> None:
    auth.store_token(URL, SecretStr("t"), keyring_entry="team-desk")
    assert ("prefect-ito", "http://127.0.0.1:9#team-desk") in memory_keyring.secrets
    with pytest.raises(NotLoggedIn):
        auth.resolve_token(URL)
    assert auth.resolve_token(URL, keyring_entry="team-desk").get_secret_value() == "t"
    with pytest.raises(NotLoggedIn):  # the same label at another origin is another entry
        auth.resolve_token("http://127.0.0.1:10", keyring_entry="team-desk")


def test_no_label_reads_another_origins_token(memory_keyring: MemoryKeyring) -> None:
    auth.store_token("https://desk.example.com", SecretStr("real"))
    # The attack: a block whose api_url is theirs and whose keyring entry names the real backend.
    with pytest.raises(ItoError, match="another backend"):
        auth.resolve_token("http://127.0.0.1:9", keyring_entry="https://desk.example.com")
    for label in ("../x", "a b", "x" * 65, "desk.example.com/"):
        with pytest.raises(ItoError, match="not a label"):
            auth.resolve_token("http://127.0.0.1:9", keyring_entry=label)
    assert auth.check_keyring_label("https://desk.example.com/", "https://desk.example.com") is None


def test_the_environment_token_belongs_to_its_own_origin_only(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(auth.ENV_API_URL, "https://desk.example.com")
    monkeypatch.setenv(auth.ENV_TOKEN, "real")
    assert auth.resolve_token("https://DESK.example.com:443/").get_secret_value() == "real"
    for elsewhere in (
        "http://desk.example.com",  # another scheme
        "https://desk.example.com:8443",  # another port
        "https://desk.example.com.evil.test",
        "http://127.0.0.1:9",
    ):
        with pytest.raises(
            NotLoggedIn, match=re.escape("belongs to https://desk.example.com only")
        ):
            auth.resolve_token(elsewhere)


def test_a_token_without_its_url_is_a_configuration_error(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(auth.ENV_TOKEN, "lonely")
    with pytest.raises(TokenWithoutOrigin, match="ITO_COMPUTE_API_URL is not") as caught:
        auth.resolve_token(URL)
    assert "lonely" not in str(caught.value)
    assert caught.value.exit_code == ExitCode.AUTHENTICATION
    monkeypatch.setenv(auth.ENV_API_URL, "not a url")
    with pytest.raises(TokenWithoutOrigin, match="not an http"):
        auth.resolve_token(URL)


def test_not_logged_in_says_how_to_log_in(memory_keyring: MemoryKeyring) -> None:
    with pytest.raises(NotLoggedIn) as caught:
        auth.resolve_token(URL)
    assert "prefect-ito login --api-url http://127.0.0.1:9" in str(caught.value)
    assert str(caught.value).startswith("not logged in to http://127.0.0.1:9")
    assert caught.value.code == "NOT_LOGGED_IN"


def test_delete_removes_and_tolerates_absence(memory_keyring: MemoryKeyring) -> None:
    auth.store_token(URL, SecretStr("t"))
    auth.delete_token(URL)
    auth.delete_token(URL)
    assert auth.load_stored_token(URL) is None


def test_file_keyring_round_trip_in_a_temporary_directory(
    file_keyring: PlaintextKeyring, tmp_path: Path
) -> None:
    auth.store_token(URL, SecretStr("kept-in-tmp"))
    assert auth.resolve_token(URL).get_secret_value() == "kept-in-tmp"
    assert Path(file_keyring.file_path).parent == tmp_path


@pytest.mark.parametrize(
    "make_backend",
    [PlaintextKeyring, lambda: ChainerBackend.__new__(ChainerBackend)],
    ids=["plaintext", "chainer-with-plaintext"],
)
def test_plaintext_keyring_is_refused_unless_allowed(
    make_backend: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    backend = make_backend()  # type: ignore[operator]
    if isinstance(backend, ChainerBackend):
        plaintext = PlaintextKeyring()
        plaintext.file_path = str(tmp_path / "k.cfg")
        monkeypatch.setattr(ChainerBackend, "backends", [MemoryKeyring(), plaintext])
    else:
        backend.file_path = str(tmp_path / "k.cfg")
    monkeypatch.setattr(keyring, "get_keyring", lambda: backend)
    monkeypatch.setenv(ALLOW, "false")

    for call in (
        auth.usable_keyring,
        lambda: auth.load_stored_token(URL),
        lambda: auth.store_token(URL, SecretStr("t")),
        lambda: auth.delete_token(URL),
    ):
        with pytest.raises(InsecureKeyring, match="PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT"):
            call()
    assert not (tmp_path / "k.cfg").exists()

    monkeypatch.setenv(ALLOW, "true")
    auth.store_token(URL, SecretStr("t"))
    assert auth.resolve_token(URL).get_secret_value() == "t"


def test_a_refused_plaintext_keyring_is_not_consulted_for_a_token(
    file_keyring: PlaintextKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth.store_token(URL, SecretStr("kept-in-a-file"))
    monkeypatch.setenv(ALLOW, "false")

    with pytest.raises(NotLoggedIn) as caught:
        auth.resolve_token(URL)

    message = str(caught.value)
    assert "prefect-ito login --api-url http://127.0.0.1:9" in message
    assert "keyring was not used" in message
    assert "PlaintextKeyring keeps secrets in a plaintext file" in message
    assert caught.value.exit_code == ExitCode.AUTHENTICATION


def test_env_token_needs_no_keyring_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyring, "get_keyring", lambda: PlaintextKeyring())
    monkeypatch.setenv(ALLOW, "false")
    monkeypatch.setenv(auth.ENV_API_URL, URL)
    monkeypatch.setenv(auth.ENV_TOKEN, "headless")
    assert auth.resolve_token(URL).get_secret_value() == "headless"


@pytest.mark.parametrize(
    "make_backend",
    [NoKeyring, NullKeyring, lambda: ChainerBackend.__new__(ChainerBackend)],
    ids=["fail", "null", "empty-chainer"],
)
def test_without_a_usable_keyring_a_token_is_not_logged_in_and_cannot_be_stored(
    make_backend: Callable[[], KeyringBackend],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(ChainerBackend, "backends", [])
    monkeypatch.setattr(keyring, "get_keyring", make_backend)

    with (
        caplog.at_level("INFO", logger="prefect_ito.backend.auth"),
        pytest.raises(NotLoggedIn) as caught,
    ):
        auth.resolve_token(URL)
    assert "keyring was not used" in str(caught.value)
    assert any("Not looking in the keyring" in record.getMessage() for record in caplog.records)
    for call in (auth.usable_keyring, lambda: auth.store_token(URL, SecretStr("t"))):
        with pytest.raises(NoUsableKeyring, match=f"set {auth.ENV_TOKEN}") as refused:
            call()
        assert type(refused.value) is NoUsableKeyring
        assert refused.value.exit_code == ExitCode.AUTHENTICATION


class DroppingKeyring(MemoryKeyring):
    """A backend that says it stored a secret and did not."""

    def set_password(self, service: str, username: str, password: str) -> None:
        return None


def test_a_keyring_that_drops_the_token_fails_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyring, "get_keyring", DroppingKeyring)
    with pytest.raises(NoUsableKeyring, match="did not keep the token"):
        auth.store_token(URL, SecretStr("t"))


def test_memory_keyring_is_never_chosen_by_keyring_itself() -> None:
    assert not MemoryKeyring.viable
    assert MemoryKeyring not in set(KeyringBackend.get_viable_backends())
    assert "in memory" in str(MemoryKeyring())


def test_api_url_comes_from_argument_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ItoError, match="no Itô backend URL"):
        auth.resolve_api_url()
    monkeypatch.setenv(auth.ENV_API_URL, "https://desk.example/")
    assert auth.resolve_api_url() == "https://desk.example"
    assert auth.resolve_api_url("http://other.example") == "http://other.example"


@pytest.mark.parametrize("bad", ["desk.example", "ftp://desk.example", "http://", "  "])
def test_api_url_must_be_http(bad: str) -> None:
    with pytest.raises(ItoError):
        auth.resolve_api_url(bad)


DEVICE = DeviceAuthorization(
    device_code="dev-1",
    user_code="ABCD-EFGH",
    verification_uri="http://desk.test/device",
    verification_uri_complete="http://desk.test/device?user_code=ABCD-EFGH",
    expires_in=600,
    interval=1,
)
GRANT = {"access_token": "granted", "token_type": "Bearer", "expires_in": 3600, "scope": "train"}


class FakeTime:
    """A clock that only moves when the fake sleep is awaited."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.now += seconds


async def test_login_polls_at_the_interval_and_slows_down() -> None:
    script = Script(
        ok(DEVICE),
        fail(ErrorCode.AUTHORIZATION_PENDING),
        fail(ErrorCode.SLOW_DOWN),
        fail(ErrorCode.AUTHORIZATION_PENDING),
        ok(GRANT),
    )
    prompts: list[DeviceAuthorization] = []
    time = FakeTime()
    async with mock_client(script, token=None) as client:
        token = await auth.login(
            client, on_prompt=prompts.append, sleep=time.sleep, clock=time.clock
        )
    assert token.get_secret_value() == "granted"
    assert prompts == [DEVICE]
    assert time.delays == [1, 1, 6, 6]
    assert script.calls[0] == "POST /v0/auth/device"
    assert set(script.calls[1:]) == {"POST /v0/auth/token"}


@pytest.mark.parametrize(
    ("code", "error"),
    [(ErrorCode.ACCESS_DENIED, AccessDenied), (ErrorCode.EXPIRED_TOKEN, ExpiredToken)],
)
async def test_login_stops_on_denial_or_expiry(code: ErrorCode, error: type[ItoError]) -> None:
    script = Script(ok(DEVICE), fail(ErrorCode.AUTHORIZATION_PENDING), fail(code))
    time = FakeTime()
    async with mock_client(script) as client:
        with pytest.raises(error):
            await auth.login(client, on_prompt=lambda _: None, sleep=time.sleep, clock=time.clock)
    assert len(script.requests) == 3


async def test_login_gives_up_when_the_device_code_expires_locally() -> None:
    script = Script(ok(DEVICE.model_copy(update={"expires_in": 3})), fail("AUTHORIZATION_PENDING"))
    time = FakeTime()
    async with mock_client(script) as client:
        with pytest.raises(ExpiredToken):
            await auth.login(client, on_prompt=lambda _: None, sleep=time.sleep, clock=time.clock)
    assert time.delays == [1, 1, 1]


def test_token_grant_never_shows_the_token() -> None:
    grant = TokenGrant.model_validate(GRANT)
    assert "granted" not in repr(grant)
    assert "granted" not in str(grant.model_dump())
