"""Commands that read a backend from a block never send its token anywhere else.

A colleague with Prefect API access writes an ``ItoCredentials`` document through Prefect's REST
API (past the model's checks) that names their server; a person then runs ``whoami`` with it.
"""

from __future__ import annotations

import json

import pytest
from capture_server import CaptureServer
from cli_helpers import person_env, prefect_ito, stored_login
from prefect import get_client
from prefect.client.schemas.actions import BlockDocumentCreate
from prefect.exceptions import ObjectNotFound

from prefect_ito.blocks import ItoCredentials
from prefect_ito.exceptions import ExitCode


async def write_raw_block(name: str, data: dict[str, object]) -> None:
    """Write an ItoCredentials document as any Prefect API user can: no model validation."""
    await ItoCredentials.aregister_type_and_schema()
    async with get_client() as client:
        block_type = await client.read_block_type_by_slug("ito-credentials")
        checksum = ItoCredentials._calculate_schema_checksum()
        schema = await client.read_block_schema_by_checksum(checksum)
        try:
            existing = await client.read_block_document_by_name(name, "ito-credentials")
            await client.delete_block_document(existing.id)
        except ObjectNotFound:
            pass
        await client.create_block_document(
            BlockDocumentCreate(
                name=name, data=data, block_schema_id=schema.id, block_type_id=block_type.id
            )
        )


def refused(result, code: ExitCode) -> str:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


async def test_a_block_pointing_their_server_at_the_real_keyring_entry_gets_nothing(
    prefect_server, simulator, tmp_path
):
    token = simulator.mint_token("person").get_secret_value()
    stored_login(tmp_path, simulator.url, token)
    with CaptureServer() as theirs:
        await write_raw_block("lure", {"api_url": theirs.url, "keyring_entry": simulator.url})
        result = prefect_ito(
            "whoami", "--credentials", "lure", env=person_env(tmp_path, prefect_server)
        )
    line = refused(result, ExitCode.INVALID_INPUT)
    assert "credentials: " in line and "another backend" in line and "block 'lure'" in line
    assert theirs.received == []
    assert token not in result.stdout + result.stderr


async def test_a_block_naming_an_origin_this_shell_is_not_for_is_refused(
    prefect_server, simulator, tmp_path
):
    token = simulator.mint_token("worker").get_secret_value()
    with CaptureServer() as theirs:
        await write_raw_block("elsewhere", {"api_url": theirs.url})
        env = person_env(
            tmp_path, prefect_server, ITO_COMPUTE_API_URL=simulator.url, ITO_COMPUTE_TOKEN=token
        )
        result = prefect_ito("whoami", "--credentials", "elsewhere", env=env)
        as_json = prefect_ito("whoami", "--credentials", "elsewhere", "--json", env=env)
    line = refused(result, ExitCode.INVALID_INPUT)
    assert f"names the Itô backend {theirs.url}" in line
    assert "ITO_COMPUTE_ALLOWED_ORIGINS" in line
    document = json.loads(as_json.stdout)
    assert document["ok"] is False and document["error"]["code"] == "ORIGIN_NOT_ALLOWED"
    assert theirs.received == []
    assert token not in result.stdout + result.stderr + as_json.stdout + as_json.stderr


@pytest.mark.slow
def test_a_token_without_its_url_is_one_line(tmp_path, simulator):
    env = person_env(tmp_path, "http://127.0.0.1:9/api", ITO_COMPUTE_TOKEN="lonely-canary")
    result = prefect_ito("whoami", "--api-url", simulator.url, env=env)
    line = refused(result, ExitCode.AUTHENTICATION)
    assert "ITO_COMPUTE_TOKEN is set but ITO_COMPUTE_API_URL is not" in line
    assert "lonely-canary" not in result.stdout + result.stderr
    assert simulator.requests() == []
