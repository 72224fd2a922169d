"""``prefect-ito capabilities``: what the backend offers, as it says it (read-only)."""

from __future__ import annotations

from typing import Any

from prefect_ito.backend import provenance
from prefect_ito.cli.errors import respond
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client

__all__ = ["capabilities"]


def capabilities(
    *, api_url: ApiUrl = None, credentials: CredentialsName = None, json_output: JsonOption = False
) -> None:
    """Show what the backend offers: its contract version, whether training runs are live, recipes.

    A backend that says training runs are not live (production today) makes `train` stop as
    Unavailable, exit code 3.
    """
    respond(json_output, _capabilities(api_url, credentials), _show)


async def _capabilities(api_url: str | None, credentials: str | None) -> dict[str, Any]:
    async with await open_client(api_url, credentials) as client:
        offered = await client.get_capabilities()
    return {"api_url": client.base_url, **offered.model_dump(mode="json")}


def _show(offered: dict[str, Any]) -> None:
    training = offered["training_run"]
    live = "live" if training["live"] else "not live: train stops as Unavailable"
    detail = f" ({training['detail']})" if training.get("detail") else ""
    long_poll = f"yes, up to {offered['max_wait_seconds']} s" if offered["long_poll"] else "no"
    print(f"api url:        {offered['api_url']}")
    print(f"schema version: {offered['schema_version']}")
    print(f"training runs:  {live}{detail}")
    print(f"post-training:  {', '.join(offered['post_training_recipes']) or '(none)'}")
    print(f"long poll:      {long_poll}")
    print(f"change feed:    {'yes' if offered['change_feed'] else 'no'}")
    answered = provenance.last_seen(offered["api_url"])
    if answered is not None:
        print(answered.describe())
