"""The OpenAPI document lists every error code each operation of the simulator can answer.

Derived from the simulator's own source, not from a hand-written list: for each route, the codes
named (``ErrorCode.X``) by the endpoint, its dependencies and every simulator function they may
call, matched by name — an over-approximation a route's ``responses`` must cover — plus what the
request validation handler answers for the route's body. Before, ``POST /v0/training-quotes``
answered ``400 CONTRACT_VERSION_UNSUPPORTED`` for a v0.3 body that the document never listed,
and a client written from the document alone did not expect it.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

import prefect_ito.simulator
from prefect_ito.contract import ErrorCode
from prefect_ito.outcomes import ERROR_STATUS
from prefect_ito.simulator.app import shared_routes, takes_a_submission
from prefect_ito.simulator.openapi import openapi_document

SIMULATOR = Path(prefect_ito.simulator.__file__).parent
LEFT_OUT = {"admin.py", "server.py", "openapi.py"}
"""The seeding surface, the test harness's client and the generator: not behind any route."""
VALIDATION_HANDLER = "_validation_error"


@dataclass(frozen=True)
class _Call:
    """A call by name: how many positional arguments, and which keywords."""

    name: str
    positional: int
    keywords: frozenset[str]


@dataclass(frozen=True)
class _Function:
    """A simulator function: what it accepts, what it calls and which codes it names."""

    accepts: Callable[[_Call], bool]
    calls: frozenset[_Call]
    codes: frozenset[str]


def _accepting(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Callable[[_Call], bool]:
    """Return whether a call fits the signature: ``dict.get(key)`` is no ``AuthorizationBook.get``.

    Matching calls by name alone would take every ``.get(…)`` for the book's ``get``; matching
    the arguments too keeps the over-approximation close to what runs.
    """
    args = node.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args) if a.arg not in ("self", "cls")]
    required = len(positional) - len(args.defaults)
    names = set(positional) | {a.arg for a in args.kwonlyargs}
    needed = {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}

    def accepts(call: _Call) -> bool:
        fits = args.vararg is not None or call.positional <= len(positional)
        named = args.kwarg is not None or call.keywords <= names
        filled = call.positional + len(call.keywords) >= required
        return fits and named and filled and needed <= call.keywords

    return accepts


def _function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> _Function:
    """Read one function's body (not its decorators: a route's ``responses=`` is no answer)."""
    calls: set[_Call] = set()
    codes: set[str] = set()
    for child in (part for statement in node.body for part in ast.walk(statement)):
        if isinstance(child, ast.Call):
            func = child.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            keywords = frozenset(k.arg for k in child.keywords if k.arg)
            if name:
                calls.add(_Call(name, len(child.args), keywords))
        is_code = isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name)
        if is_code and child.value.id == "ErrorCode":  # type: ignore[union-attr]
            codes.add(child.attr)  # type: ignore[union-attr]
    return _Function(_accepting(node), frozenset(calls), frozenset(codes))


@cache
def _index() -> dict[str, list[_Function]]:
    """Return each function name in the simulator's modules, with each function of that name."""
    index: dict[str, list[_Function]] = {}
    for module in sorted(SIMULATOR.glob("*.py")):
        if module.name in LEFT_OUT:
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                index.setdefault(node.name, []).append(_function(node))
    return index


def _reachable_codes(roots: set[str]) -> set[str]:
    """Return the codes named by ``roots`` and every simulator function they may call."""
    seen: set[int] = set()
    codes: set[str] = set()
    todo = [function for name in roots for function in _index().get(name, [])]
    while todo:
        function = todo.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        codes |= function.codes
        for call in function.calls:
            todo.extend(f for f in _index().get(call.name, []) if f.accepts(call))
    return codes


def _dependencies(route: APIRoute) -> Iterator[Callable[..., Any]]:
    """Yield the endpoint and every dependency FastAPI calls for ``route``."""
    todo = [route.dependant]
    while todo:
        dependant = todo.pop()
        if dependant.call is not None:
            yield dependant.call
        todo.extend(dependant.dependencies)


def _validation_codes(route: APIRoute) -> set[str]:
    """Return what the request validation handler may answer for ``route``'s requests: its
    v0.3 ``CONTRACT_VERSION_UNSUPPORTED`` only for a submission's body."""
    codes = _reachable_codes({VALIDATION_HANDLER})
    if not takes_a_submission(route):
        codes.discard(ErrorCode.CONTRACT_VERSION_UNSUPPORTED.name)
    return codes


UNREACHABLE = {
    ("/v0/training-runs/changes", ErrorCode.QUOTE_NOT_FOUND): "the feed reads only the quotes "
    "the account holds (`holds()` is asked first), so `held()` never refuses there",
}
"""Codes the derivation finds that cannot happen on a route, each with why."""


def _derived(route: APIRoute) -> set[ErrorCode]:
    roots = {call.__name__ for call in _dependencies(route) if inspect.isfunction(call)}
    codes = {ErrorCode[name] for name in _reachable_codes(roots) | _validation_codes(route)}
    return {code for code in codes if (route.path, code) not in UNREACHABLE}


def _documented(operation: dict[str, Any]) -> set[ErrorCode]:
    """Return the codes the operation's error responses name ("Error envelope: A, B")."""
    codes: set[ErrorCode] = set()
    for status, response in operation["responses"].items():
        listed = response.get("description", "").partition("Error envelope: ")[2]
        for name in filter(None, (part.strip() for part in listed.split(","))):
            code = ErrorCode(name)
            assert str(ERROR_STATUS[code]) == status, (name, status)
            codes.add(code)
    return codes


def _api_routes() -> Iterator[APIRoute]:
    """Yield the app's routes, through the included routers (FastAPI wraps each since 0.150)."""
    for route in shared_routes().routes:
        contexts = getattr(route, "effective_route_contexts", None)
        for candidate in [c.original_route for c in contexts()] if contexts else [route]:
            if isinstance(candidate, APIRoute):
                yield candidate


ROUTES = [
    route for route in _api_routes() if route.include_in_schema and route.path.startswith("/v0")
]
OPERATIONS = [(method.lower(), route) for route in ROUTES for method in sorted(route.methods)]


@pytest.mark.parametrize(
    ("method", "route"), OPERATIONS, ids=[f"{m} {r.path}" for m, r in OPERATIONS]
)
def test_the_document_lists_every_error_an_operation_can_answer(method: str, route: APIRoute):
    operation = openapi_document()["paths"][route.path][method]

    missing = _derived(route) - _documented(operation)

    assert not missing, sorted(code.value for code in missing)


def test_the_derivation_finds_what_the_simulator_raises():
    # The derivation must see through the engine: a submission's refusals are raised there.
    submit = next(r for r in ROUTES if r.path == "/v0/training-runs" and "POST" in r.methods)

    derived = _derived(submit)

    assert {
        ErrorCode.CONFIRMATION_REQUIRED,
        ErrorCode.AUTHORIZATION_DOES_NOT_COVER,
        ErrorCode.INSUFFICIENT_SCOPE,
        ErrorCode.CONTRACT_VERSION_UNSUPPORTED,
    } <= derived
