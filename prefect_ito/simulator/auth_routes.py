"""Device authorization routes (RFC 8628 shape) and the small HTML page a person approves on.

The page signs the person in as the confirm page does (``person_session.py``: the passphrase,
the CSRF token, the origin check, the throttle on wrong codes and passphrases); the browser
stays signed in, so the confirm page needs no second sign-in.
"""

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
from prefect_ito.simulator.ids import DEVICE_PAGE
from prefect_ito.simulator.person_session import (
    PageRefusal,
    PageSession,
    PersonFormDep,
    form_fields,
    respond,
)
from prefect_ito.simulator.state import Info, SimState, SimStateDep, Token

router = APIRouter(prefix="/v0/auth", tags=["auth"])
page_router = APIRouter(include_in_schema=False)

BACKEND_NAME = "ito-desk-simulator"
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Itô desk simulator: device login</title></head>
<body><h1>Device login</h1><p>{message}</p>{form}</body></html>
"""
_FORM = """<form method="post" action="{action}">{person}
<label>User code <input name="user_code" value="{user_code}" required></label>
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


@page_router.get(DEVICE_PAGE, response_class=HTMLResponse)
async def device_page(
    request: Request, state: SimStateDep, user_code: Annotated[str, Query(max_length=32)] = ""
) -> HTMLResponse:
    """The verification page: a form to sign in, enter the user code and approve or deny."""
    session = state.pages.open(request)
    return _page(request, session, "Enter the code your terminal shows.", user_code)


@page_router.post(DEVICE_PAGE, response_class=HTMLResponse)
async def device_answer(
    request: Request,
    state: SimStateDep,
    form: PersonFormDep,
    user_code: Annotated[str, Form(max_length=32)],
    decision: Annotated[Literal["approve", "deny"], Form()],
) -> HTMLResponse:
    """Record the signed-in person's answer and say what happened."""
    approve = decision == "approve"
    session = state.pages.open(request)
    try:
        session = state.pages.admit(request, session, form)
        _answer(state, request, session, user_code, approve)
    except PageRefusal as refusal:
        return _page(request, session, refusal.message, user_code, refusal)
    message = "Approved: return to your terminal." if approve else "Denied."
    return respond(request, session, _PAGE.format(message=message, form=""))


def _answer(
    state: SimState, request: Request, session: PageSession, user_code: str, approve: bool
) -> None:
    """Answer the device grant the code names as the signed-in person (a wrong code counts)."""

    def look_up() -> bool | None:
        assert session.account is not None  # try_code asks for a sign-in first
        return state.identity.verify(user_code, approve=approve, account=session.account) or None

    state.pages.try_code(request, session, look_up)


def _page(
    request: Request,
    session: PageSession,
    message: str,
    user_code: str,
    refusal: PageRefusal | None = None,
) -> HTMLResponse:
    form = _FORM.format(
        action=DEVICE_PAGE, person=form_fields(session), user_code=escape(user_code)
    )
    html = _PAGE.format(message=escape(message), form=form)
    if refusal is None:
        return respond(request, session, html)
    return respond(request, session, html, refusal.status_code, refusal.headers)
