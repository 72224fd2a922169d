"""What `train` says at a terminal when its spend waits for a person: words that send them to the
right place. A pseudo-terminal, as a person would read and type, and a simulator's real quote.
"""

from __future__ import annotations

import os
import sys

import pytest
from cli_helpers import converse, person_quote

from prefect_ito.backend.origins import ENV_API_URL, ENV_TOKEN
from prefect_ito.simulator import SimulatorServer

ASK = """
import asyncio, os, uuid
from rich.console import Console
from prefect_ito.cli import terminal
from prefect_ito.waiting.waits import QuoteWait
record = QuoteWait(api_url=os.environ["ITO_COMPUTE_API_URL"], quote_id=os.environ["QUOTE_ID"],
                   manifest_digest=os.environ["DIGEST"], expires_at=os.environ["EXPIRES_AT"])
terminal._announce_pause(Console(), uuid.UUID(os.environ["FLOW_RUN_ID"]), spend=True)
pause = terminal.SpendPause(None, "### Spend", record)
answer = asyncio.run(terminal.confirm_at_terminal(pause))
print("The flow is given:", answer.decision if answer else None)
"""

FLOW_RUN_ID = "0b4bd1a6-4a58-4b43-9d0b-6a2f3f0f4f11"
UI = "http://127.0.0.1:9"
"""A Prefect server's UI that the words name; nothing here reaches it."""


@pytest.mark.slow  # a pseudo-terminal, in a child process
def test_the_spend_prompt_sends_a_person_to_the_backend_and_lists_only_its_own_answers():
    # Before: "Confirm or decline in the Prefect UI: <link>", where the form can only decline
    # or recheck; and the form's answers (decline, recheck) printed right above the terminal's
    # own [confirm/decline] prompt.
    with SimulatorServer() as simulator:
        token, quote = person_quote(simulator)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ITO_COMPUTE_")},
            ENV_API_URL: simulator.url, ENV_TOKEN: token,
            "PREFECT_API_URL": f"{UI}/api", "PREFECT_UI_URL": UI, "COLUMNS": "200",
            "QUOTE_ID": quote["quote_id"], "DIGEST": quote["manifest_digest"],
            "EXPIRES_AT": quote["expires_at"], "FLOW_RUN_ID": FLOW_RUN_ID,
        }  # fmt: skip

        code, output = converse(
            [sys.executable, "-c", ASK],
            env,
            [("[confirm/decline]", "d\n"), ("Why (optional): ", "too dear\n")],
        )

    assert code == 0, output
    said = " ".join(output.split())
    before_prompt = said[: said.index("[confirm/decline]")]
    assert "decline in the Prefect UI" not in said
    assert "confirmation at the backend" in before_prompt
    assert "prefect-ito confirm QUOTE_ID" in before_prompt
    assert (
        f"The flow run in the Prefect UI: {UI}/runs/flow-run/{FLOW_RUN_ID} (its form can only "
        "decline the spend" in before_prompt
    )
    assert quote["confirm_url"] in before_prompt  # the backend's page, where a person confirms
    # The terminal's own two answers, and not the form's.
    assert "confirm: confirmed at the backend as you" in before_prompt
    assert "decline: nothing is submitted" in before_prompt
    assert "recheck:" not in before_prompt and "Choose one" not in before_prompt
    assert "The flow is given: decline" in said
