"""A token goes only to its own backend's origin: the origin rules, the client's header, redirects.

Each test plays a colleague with access to the team's Prefect API and no Itô token: they can name
any backend URL in a parameter, a block or a record, and run a server that records every header.
"""

from __future__ import annotations

import pytest
from capture_server import CaptureServer
from pydantic import SecretStr

from prefect_ito.backend import origins
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.memory_keyring import MemoryKeyring
from prefect_ito.blocks import ItoCredentials, resolve_credentials
from prefect_ito.exceptions import (
    ExitCode,
    ItoError,
    NotLoggedIn,
    OriginNotAllowed,
    TokenWithoutOrigin,
)

CANARY = "canary-token-origin-5b1f"


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://Desk.Example.com/", "https://desk.example.com"),
        ("https://desk.example.com:443/v0/x", "https://desk.example.com"),
        ("http://desk.example.com:80", "http://desk.example.com"),
        ("http://desk.example.com:8080", "http://desk.example.com:8080"),
        ("http://[::1]:9/", "http://[::1]:9"),
        ("https://bücher.example", "https://xn--bcher-kva.example"),
    ],
)
def test_an_origin_is_scheme_host_and_port(url: str, origin: str) -> None:
    assert origins.origin_of(url) == origin


@pytest.mark.parametrize("bad", ["desk.example.com", "ftp://desk.example.com", "http://", ""])
def test_an_origin_needs_an_http_url(bad: str) -> None:
    with pytest.raises(ItoError):
        origins.origin_of(bad)


def test_nothing_configured_admits_any_origin_for_its_own_keyring_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    origins.admit("http://127.0.0.1:9", source="a test")  # a person's own machine


def test_a_configured_process_admits_its_origin_and_the_allowlist_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(origins.ENV_API_URL, "https://desk.example.com")
    monkeypatch.setenv(origins.ENV_ALLOWED_ORIGINS, "https://staging.example.com, http://[::1]:9")
    for url in ("https://desk.example.com/", "https://staging.example.com", "http://[::1]:9/v0"):
        origins.admit(url, source="a test")
    with pytest.raises(OriginNotAllowed) as refused:
        origins.admit("http://127.0.0.1:9", source="the credentials parameter")
    message = str(refused.value)
    assert message.startswith("the credentials parameter names the Itô backend http://127.0.0.1:9")
    assert "add http://127.0.0.1:9 to ITO_COMPUTE_ALLOWED_ORIGINS" in message
    assert "\n" not in message
    assert refused.value.exit_code == ExitCode.INVALID_INPUT
    assert refused.value.state_name == "OriginNotAllowed"


@pytest.mark.parametrize(
    "entry", ["https://desk.example.com/v0", "desk.example.com", "https://u@desk.example.com"]
)
def test_an_allowlist_entry_must_be_an_origin(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    monkeypatch.setenv(origins.ENV_ALLOWED_ORIGINS, entry)
    with pytest.raises(OriginNotAllowed, match=r"ITO_COMPUTE_ALLOWED_ORIGINS: .* is not an origin"):
        origins.admit("https://desk.example.com", source="a test")


def test_a_token_alone_in_the_environment_admits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(origins.ENV_TOKEN, CANARY)
    with pytest.raises(TokenWithoutOrigin) as refused:
        origins.admit("http://127.0.0.1:9", source="a test")
    assert CANARY not in str(refused.value)


async def test_a_block_naming_another_origin_stops_before_any_request(
    monkeypatch: pytest.MonkeyPatch, memory_keyring: MemoryKeyring
) -> None:
    with CaptureServer() as real, CaptureServer() as theirs:
        monkeypatch.setenv(origins.ENV_API_URL, real.url)
        monkeypatch.setenv(origins.ENV_TOKEN, CANARY)
        with pytest.raises(OriginNotAllowed):
            await resolve_credentials({"api_url": theirs.url})
        with pytest.raises(OriginNotAllowed):
            ItoCredentials(api_url=theirs.url).get_client()
        # Allowed, it still gets no token: the environment's belongs to the real backend only.
        monkeypatch.setenv(origins.ENV_ALLOWED_ORIGINS, theirs.url)
        with pytest.raises(NotLoggedIn, match=f"belongs to {real.url} only"):
            ItoCredentials(api_url=theirs.url).get_client()
    assert theirs.received == []


async def test_a_keyring_entry_cannot_point_a_block_at_another_origins_token(
    memory_keyring: MemoryKeyring,
) -> None:
    real_url = "https://desk.example.com"
    memory_keyring.set_password("prefect-ito", real_url, CANARY)
    with CaptureServer() as theirs:
        with pytest.raises(ValueError, match="another backend"):
            ItoCredentials(api_url=theirs.url, keyring_entry=real_url)
        with pytest.raises(ItoError, match=r"credentials.*another backend"):
            await resolve_credentials({"api_url": theirs.url, "keyring_entry": real_url})
    assert theirs.received == []


async def test_the_header_goes_to_the_tokens_origin_and_no_other() -> None:
    with CaptureServer() as home, CaptureServer() as elsewhere:
        async with ItoClient(home.url, SecretStr(CANARY), max_retries=0) as client:
            await client._http.get("/v0/capabilities")
            # An absolute URL replaces the base URL in httpx: the token must not go with it.
            await client._http.get(f"{elsewhere.url}/v0/capabilities")
    assert home.authorizations == [f"Bearer {CANARY}"]
    assert [r.path for r in elsewhere.received] == ["/v0/capabilities"]
    assert elsewhere.authorizations == []


async def test_a_redirect_is_not_followed_and_carries_no_token_away() -> None:
    with CaptureServer() as elsewhere, CaptureServer(redirect_to=elsewhere.url) as home:
        async with ItoClient(home.url, SecretStr(CANARY), max_retries=0) as client:
            with pytest.raises(ItoError) as failed:
                await client.get_capabilities()
    assert len(home.received) == 1
    assert elsewhere.received == []
    assert CANARY not in str(failed.value)
