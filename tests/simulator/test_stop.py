"""Stopping the simulator answers the long-polls it holds, rather than cutting them."""

from __future__ import annotations

import threading
import time

import httpx


def test_stop_answers_an_open_long_poll_and_logs_no_error(desk_for, capfd):
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    capfd.readouterr()  # only what the stop prints counts
    answers: list[httpx.Response | Exception] = []

    def poll() -> None:
        try:
            answers.append(
                desk.http.get(
                    f"/v0/training-runs/{run['run_id']}",
                    params={"after_version": run["version"], "wait": 30},
                )
            )
        except httpx.HTTPError as error:
            answers.append(error)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)  # let the long-poll reach the simulator and start holding
    started = time.monotonic()
    desk.sim.stop()
    poller.join(timeout=10)

    # The open long-poll ends with an answer (the run as it stands), not a cut connection.
    [answer] = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 200
    assert answer.json()["data"]["version"] == run["version"]
    assert time.monotonic() - started < 5
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out
    assert "ERROR" not in printed.err + printed.out
