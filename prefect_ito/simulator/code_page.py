"""What the person's pages a code opens share (the confirm page, the decide page, as device login).

A :class:`CodePage` holds a page's path, title and forms: the code form (the code, and the
sign-in unless the person is signed in), the answer form (the page's own fields), and the
taking of a code, where a wrong code counts against the person (``person_session.py`` holds
the sign-in, the CSRF token, the origin check, the throttle and the headers). What a code names,
and what an answer records, is each page's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Annotated, TypeVar

from fastapi import Form, Query, Request
from fastapi.responses import HTMLResponse

from prefect_ito.simulator.person_session import (
    PageRefusal,
    PageSession,
    PersonForm,
    form_fields,
    page,
)
from prefect_ito.simulator.state import SimState, SimStateDep

T = TypeVar("T")
UserCode = Annotated[str, Form(max_length=32)]
"""The code a page's form posts."""
UserCodeQuery = Annotated[str, Query(max_length=32)]
"""The code a page's link carries, for its code form to keep."""
_CODE = """<form method="post" action="{action}">{person}
<label>{label} <input name="user_code" value="{user_code}" required></label>
<button type="submit">{button}</button>
</form>"""
_ANSWER = """<form method="post" action="{action}">{person}
<input type="hidden" name="user_code" value="{user_code}">
{fields}</form>"""


def table_html(rows: list[tuple[str, str]]) -> str:
    """Return what a code names as a page shows it: a table of rows, each escaped."""
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


@dataclass(frozen=True)
class CodePage:
    """One page a code opens; see the module docstring."""

    path: str
    what: tuple[str, str]
    """Its title and its heading."""
    code_label: str
    """What the code form calls the code."""
    shows: str
    """What the code shows the person, as the code form's button names it."""
    answer_fields: str
    """The answer form's own fields and buttons, each line ending in a newline."""
    signed_out: str
    """What the code form says to a person not signed in."""
    signed_in: str
    """What the code form says to a person signed in."""

    def answer(
        self,
        request: Request,
        session: PageSession,
        message: str,
        body: str = "",
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> HTMLResponse:
        """Answer with the page, saying ``message`` above ``body``."""
        return page(request, session, self.what, message, body, status, headers)

    def code_form(self, session: PageSession, user_code: str) -> str:
        """Return the form that asks for the code, and for the sign-in if nobody is in."""
        button = f"Show {self.shows}" if session.account else "Sign in"
        return _CODE.format(
            action=self.path,
            person=form_fields(session),
            label=self.code_label,
            user_code=escape(user_code),
            button=button,
        )

    def answer_form(self, session: PageSession, user_code: str) -> str:
        """Return the form that answers what the code names."""
        return _ANSWER.format(
            action=self.path,
            person=form_fields(session),
            user_code=escape(user_code),
            fields=self.answer_fields,
        )

    async def show(
        self, request: Request, state: SimStateDep, user_code: UserCodeQuery = ""
    ) -> HTMLResponse:
        """The page's GET: the code form, and the person's sign-in unless they are signed in."""
        session = state.pages.open(request)
        message = self.signed_in if session.account else self.signed_out
        return self.answer(request, session, message, self.code_form(session, user_code))

    def take_code(
        self,
        request: Request,
        state: SimState,
        form: PersonForm,
        user_code: str,
        find: Callable[[SimState, PageSession, str], T | None],
    ) -> tuple[PageSession, T] | HTMLResponse:
        """Admit the POST (signing the person in if it carries a sign-in) and return the session
        and what ``find`` finds of the signed-in person's under the code; or the page that
        answers instead: the code form again, asking for the code or saying what was refused."""
        pages = state.pages
        session = pages.open(request)
        try:
            session = pages.admit(request, session, form)
            if not user_code and session.account:  # signed in, with no code yet: ask for it
                return self.answer(request, session, "Enter the code.", self.code_form(session, ""))
            found = pages.try_code(request, session, lambda: find(state, session, user_code))
        except PageRefusal as refusal:
            body = self.code_form(session, user_code)
            return self.answer(
                request, session, refusal.message, body, refusal.status_code, refusal.headers
            )
        return session, found
