"""Login → whoami → logout against the simulator's device flow, through the API and the CLI."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from device_login import approve_in_browser
from ito_fakes import Sleeps
from keyrings.alt.file import PlaintextKeyring

from prefect_ito.backend import auth
from prefect_ito.backend.client import ItoClient
from prefect_ito.cli import app
from prefect_ito.contract import DeviceAuthorization
from prefect_ito.exceptions import ExitCode, TokenRevoked

USER_CODE = re.compile(r"\b[A-Z]{4}-[A-Z]{4}\b")


def run_cli(*args: str) -> int:
    try:
        app(list(args))
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


async def test_device_login_whoami_logout_round_trip(
    sim: Any, file_keyring: PlaintextKeyring
) -> None:
    def prompt(grant: DeviceAuthorization) -> None:
        approve_in_browser(grant.verification_uri, grant.user_code)

    async with ItoClient(sim.url) as anonymous:
        token = await auth.login(anonymous, on_prompt=prompt)
    auth.store_token(sim.url, token)

    stored = auth.resolve_token(sim.url)
    async with ItoClient(sim.url, stored) as client:
        me = await client.whoami()
        assert (await client.revoke_token()).revoked
    auth.delete_token(sim.url)
    async with ItoClient(sim.url, stored, sleep=Sleeps()) as client:
        with pytest.raises(TokenRevoked):
            await client.whoami()

    assert me.account == "ana"
    assert auth.load_stored_token(sim.url) is None
    assert token.get_secret_value() not in Path(file_keyring.file_path).read_text()


def test_cli_login_whoami_logout(
    sim: Any, file_keyring: PlaintextKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    codes: list[int] = []
    login = threading.Thread(target=lambda: codes.append(run_cli("login", "--api-url", sim.url)))
    login.start()
    printed = ""
    deadline = time.monotonic() + 30
    while not USER_CODE.search(printed) and time.monotonic() < deadline:
        time.sleep(0.05)
        printed += capsys.readouterr().out
    found = USER_CODE.search(printed)
    assert found, printed
    approve_in_browser(f"{sim.url}/device", found.group())
    login.join(timeout=30)
    assert codes == [0]
    token = auth.load_stored_token(sim.url)
    assert token is not None

    assert run_cli("whoami", "--api-url", sim.url) == 0
    out = capsys.readouterr().out
    assert "account:   ana" in out
    assert sim.url in out
    assert token.get_secret_value() not in out

    assert run_cli("logout", "--api-url", sim.url) == 0
    assert auth.load_stored_token(sim.url) is None
    assert run_cli("whoami", "--api-url", sim.url) == ExitCode.AUTHENTICATION
    assert "not logged in" in capsys.readouterr().err


def test_failed_revocation_keeps_the_local_token(
    file_keyring: PlaintextKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect_ito.simulator import SimulatorServer

    with SimulatorServer() as sim:
        url = sim.url
        auth.store_token(url, sim.mint_token())
    # The backend is gone: revocation cannot succeed, so nothing local may be deleted.
    assert run_cli("logout", "--api-url", url) == 1
    err = capsys.readouterr().err
    assert "kept" in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert auth.load_stored_token(url) is not None


def test_url_comes_from_the_environment(
    sim: Any,
    file_keyring: PlaintextKeyring,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    auth.store_token(sim.url, sim.mint_token("env-user"))
    monkeypatch.setenv(auth.ENV_API_URL, sim.url)
    assert run_cli("whoami") == 0
    assert "account:   env-user" in capsys.readouterr().out


def test_without_a_url_the_cli_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("whoami") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no Itô backend URL")
    assert "Traceback" not in err


def test_no_command_accepts_a_token() -> None:
    for command in ("login", "logout", "whoami"):
        assert run_cli(command, "--token", "secret") != 0
