"""Provenance and deprecations reach the logs, the summary and the CLI, each said once."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from ito_fakes import BASE_URL, Script, Sleeps, envelope, mock_client, sample_run
from pydantic import SecretStr

from prefect_ito.backend.auth import ENV_API_URL, ENV_TOKEN
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.provenance import Provenance, is_loopback, last_seen
from prefect_ito.cli import auth as cli_auth
from prefect_ito.cli import training as cli_training
from prefect_ito.contract import EventPage, TrainingRun
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.reporting.report import TrainingSummary
from prefect_ito.simulator.envelopes import NOTICE
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.plain import ClientSteps

CLIENT_LOG = "prefect_ito.backend.client"
LOOPBACK_URL = "http://127.0.0.1:9"


def answer(
    data: Any, *, live: bool = False, notice: str | None = None, **headers: str
) -> httpx.Response:
    body = envelope(data) | {"live_api_contacted": live, "notice": notice}
    return httpx.Response(200, json=body, headers=headers)


def client_for(script: Script, url: str) -> ItoClient:
    return ItoClient(url, SecretStr("t"), transport=httpx.MockTransport(script), sleep=Sleeps())


def client_messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == CLIENT_LOG and r.levelno == level]


async def test_the_notice_is_logged_once_per_client(caplog: pytest.LogCaptureFixture) -> None:
    script = Script(answer(sample_run(), notice="Reference desk simulator: nothing is trained."))
    with caplog.at_level(logging.INFO, logger=CLIENT_LOG):
        for _ in range(2):
            async with client_for(script, LOOPBACK_URL) as client:
                for _ in range(3):
                    await client.get_training_run("run-1")

    notices = client_messages(caplog, logging.INFO)
    assert len(notices) == 2  # one per client, not one per answer
    assert "Reference desk simulator: nothing is trained." in notices[0]
    assert "live API contacted: no" in notices[0]
    assert client_messages(caplog, logging.WARNING) == []  # loopback: no surprise
    assert client.provenance == Provenance(
        api_url=LOOPBACK_URL,
        live_api_contacted=False,
        notice="Reference desk simulator: nothing is trained.",
    )


async def test_a_backend_off_loopback_that_is_not_live_is_a_warning_naming_its_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=CLIENT_LOG):
        async with mock_client(Script(answer(sample_run()))) as client:
            await client.get_training_run("run-1")
            await client.get_training_run("run-1")

    warnings = client_messages(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert f"The Itô backend at {BASE_URL} is not on loopback" in warnings[0]
    assert "live_api_contacted: false" in warnings[0]


async def test_a_live_backend_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=CLIENT_LOG):
        async with mock_client(Script(answer(sample_run(), live=True))) as client:
            await client.get_training_run("run-1")

    assert client_messages(caplog, logging.WARNING) == []
    assert client.provenance is not None and client.provenance.live_api_contacted


async def test_an_error_envelope_says_where_it_came_from_too() -> None:
    body = envelope(error={"code": "RUN_NOT_FOUND", "message": "no"}) | {"notice": "staging"}
    async with mock_client(Script(httpx.Response(404, json=body)), max_retries=0) as client:
        with pytest.raises(Exception, match="RUN_NOT_FOUND"):
            await client.get_training_run("run-1")

    assert client.provenance == Provenance(
        api_url=BASE_URL, live_api_contacted=False, notice="staging"
    )


async def test_a_notice_cannot_forge_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    forged = "hello\n12:00:00 | CRITICAL | token leaked\x1b[31m"
    with caplog.at_level(logging.INFO, logger=CLIENT_LOG):
        async with client_for(Script(answer(sample_run(), notice=forged)), LOOPBACK_URL) as c:
            await c.get_training_run("run-1")

    (logged,) = client_messages(caplog, logging.INFO)
    assert "\n" not in logged and "\x1b" not in logged
    assert "hello 12:00:00 | CRITICAL | token leaked" in logged


async def test_deprecation_and_sunset_are_logged_once_per_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deprecated = answer(
        sample_run(),
        live=True,
        Deprecation="@1767225600",
        Sunset="Wed, 30 Jun 2027 00:00:00 GMT",
        Link='<https://desk.example/docs/migrate>; rel="deprecation"',
    )
    script = Script(deprecated)
    with caplog.at_level(logging.WARNING, logger=CLIENT_LOG):
        async with mock_client(script) as client:
            for _ in range(3):
                await client.get_training_run("run-1")
            await client.get_training_run("run-2", after_version=1, wait=1)  # same endpoint
            page = EventPage(events=[], last_seq=0).model_dump(mode="json")
            script.__init__(answer(page, live=True, Sunset="Wed, 30 Jun 2027 00:00:00 GMT"))
            await client.list_events("run-1")

    warnings = client_messages(caplog, logging.WARNING)
    assert len(warnings) == 2
    assert "deprecates GET /v0/training-runs/{run_id} (Deprecation: @1767225600; " in warnings[0]
    assert "Sunset: Wed, 30 Jun 2027 00:00:00 GMT)" in warnings[0]
    assert "see https://desk.example/docs/migrate" in warnings[0]
    assert "GET /v0/training-runs/{run_id}/events (Deprecation: not given;" in warnings[1]


async def test_an_answer_without_deprecation_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=CLIENT_LOG):
        async with mock_client(Script(answer(sample_run(), live=True))) as client:
            await client.get_training_run("run-1")
    assert client_messages(caplog, logging.WARNING) == []


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8765", True),
        ("http://127.3.2.1", True),
        ("http://localhost:1", True),
        ("http://[::1]:8765", True),
        ("http://desk.localhost", True),
        ("https://desk.example.com", False),
        ("http://10.0.0.7:8765", False),
        ("http://127.0.0.1.example.com", False),
    ],
)
def test_loopback_is_this_machine_only(url: str, loopback: bool) -> None:
    assert is_loopback(url) is loopback


async def test_the_process_keeps_the_last_provenance_per_backend() -> None:
    url = "http://provenance-registry.test"
    async with client_for(Script(answer(sample_run(), notice="first")), url) as client:
        await client.get_training_run("run-1")

    found = last_seen("HTTP://Provenance-Registry.test/")  # another spelling of the same URL
    assert found is not None and found.notice == "first"


def test_the_summary_says_where_the_answers_came_from() -> None:
    run = sample_run()
    provenance = Provenance(api_url=LOOPBACK_URL, live_api_contacted=False, notice=NOTICE)

    summary = TrainingSummary.of(run, provenance)

    assert (summary.api_url, summary.live_api_contacted, summary.notice) == (
        LOOPBACK_URL,
        False,
        NOTICE,
    )
    assert TrainingSummary.of(run).live_api_contacted is None  # unknown, not a guess


class _Backend:
    def __init__(self, run: TrainingRun) -> None:
        self.run = run

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return answer(EventPage(events=[], last_seq=0), notice="a staging desk")
        return answer(self.run, notice="a staging desk")


async def test_supervision_logs_where_the_answers_come_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    finished = TrainingRun.model_validate(
        sample_run().model_dump(mode="json") | {"state": "succeeded"}
    )
    logger = logging.getLogger("test.supervision.provenance")
    async with mock_client(Script(_Backend(finished))) as client:
        await client.get_training_run("run-1")  # what start() would have read
        steps = ClientSteps(client, SupervisionParameters(), logger)
        with caplog.at_level(logging.INFO, logger=logger.name):
            await supervision.supervise(steps, finished)

    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger.name]
    assert (logging.WARNING, Provenance(api_url=BASE_URL, live_api_contacted=False).warning()) in (
        logged
    )
    assert (
        logging.INFO,
        f"Itô backend {BASE_URL}: live API contacted: no. Notice: a staging desk",
    ) in logged


async def test_whoami_prints_whether_the_backend_is_live_and_its_notice(
    sim: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_API_URL, sim.url)
    monkeypatch.setenv(ENV_TOKEN, sim.mint_token().get_secret_value())

    cli_auth._show_whoami(await cli_auth._whoami(sim.url, None))

    out = capsys.readouterr().out
    assert "live api:  no\n" in out
    assert f"notice:    {NOTICE}\n" in out


async def test_train_ends_by_saying_where_the_answers_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "http://train-summary.test"
    async with client_for(Script(answer(sample_run(), notice="staging desk")), url) as client:
        await client.get_training_run("run-1")

    cli_training._print_backends()

    out = capsys.readouterr().out
    assert f"Itô backend {url}: live API contacted: no. Notice: staging desk" in out
