"""Device authorization routes (RFC 8628 shape) and the small HTML page a person approves on."""

from __future__ import annotations

from html import escape
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse

from prefect_ito.contract import (
    DeviceAuthorization,
    DeviceTokenRequest,
    Envelope,
    ErrorCode,
    Revocation,
    TokenGrant,
    WhoAmI,
)
from prefect_ito.simulator.envelopes import (
    AUTHENTICATED_ERRORS,
    COMMON_ERRORS,
    documented,
    ok,
)
from prefect_ito.simulator.state import Info, SimStateDep, Token

router = APIRouter(prefix="/v0/auth", tags=["auth"])
page_router = APIRouter(include_in_schema=False)

BACKEND_NAME = "ito-desk-simulator"
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Itô desk simulator: device login</title></head>
<body><h1>Device login</h1><p>{message}</p>{form}</body></html>
"""
_FORM = """<form method="post" action="/device">
<label>User code <input name="user_code" value="{user_code}" required></label>
<label>Account <input name="account" value="sim-user" required></label>
<button name="decision" value="approve" type="submit">Approve</button>
<button name="decision" value="deny" type="submit">Deny</button>
</form>"""


@router.post("/device", responses=documented(*COMMON_ERRORS))
async def start_device_authorization(
    state: SimStateDep, request: Request
) -> Envelope[DeviceAuthorization]:
    """Begin device login: show the person the user code and the verification page."""
    return ok(state.identity.start_device(str(request.base_url)))


@router.post(
    "/token",
    responses=documented(
        *COMMON_ERRORS,
        ErrorCode.AUTHORIZATION_PENDING,
        ErrorCode.SLOW_DOWN,
        ErrorCode.ACCESS_DENIED,
        ErrorCode.EXPIRED_TOKEN,
    ),
)
async def poll_device_token(state: SimStateDep, body: DeviceTokenRequest) -> Envelope[TokenGrant]:
    """Poll for the token at the interval given; errors say why it is not ready."""
    return ok(state.identity.poll(body.device_code))


@router.post("/revoke", responses=documented(*AUTHENTICATED_ERRORS))
async def revoke_token(state: SimStateDep, token: Token) -> Envelope[Revocation]:
    """Revoke the presented bearer token."""
    state.identity.revoke(token)
    return ok(Revocation(revoked=True))


@router.get("/whoami", responses=documented(*AUTHENTICATED_ERRORS))
async def whoami(info: Info, request: Request) -> Envelope[WhoAmI]:
    """The account, the principal, the backend, and the token's expiry and scopes; never the token.

    Any valid token may ask, whatever its scopes.
    """
    return ok(
        WhoAmI(
            account=info.account,
            backend=f"{BACKEND_NAME} at {request.base_url}",
            expires_at=info.expires_at,
            scopes=list(info.scopes),
            principal=info.principal,
        )
    )


@page_router.get("/device", response_class=HTMLResponse)
async def device_page(user_code: Annotated[str, Query(max_length=32)] = "") -> HTMLResponse:
    """The verification page: a form to enter the user code and approve or deny."""
    form = _FORM.format(user_code=escape(user_code))
    return HTMLResponse(_PAGE.format(message="Enter the code your terminal shows.", form=form))


@page_router.post("/device", response_class=HTMLResponse)
async def device_answer(
    state: SimStateDep,
    user_code: Annotated[str, Form(max_length=32)],
    decision: Annotated[Literal["approve", "deny"], Form()],
    account: Annotated[str, Form(min_length=1, max_length=128)] = "sim-user",
) -> HTMLResponse:
    """Record the person's answer and say what happened."""
    approve = decision == "approve"
    if not state.identity.verify(user_code, approve=approve, account=account):
        form = _FORM.format(user_code=escape(user_code))
        return HTMLResponse(
            _PAGE.format(message="That code is unknown or expired.", form=form), status_code=400
        )
    message = "Approved: return to your terminal." if approve else "Denied."
    return HTMLResponse(_PAGE.format(message=message, form=""))
