"""``prefect-ito simulator``: serve the reference desk simulator in the foreground."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from prefect_ito.cli.errors import exit_with, require_positive
from prefect_ito.contract import Scope
from prefect_ito.exceptions import InvalidParameters
from prefect_ito.parameters import invalid_parameters
from prefect_ito.simulator import Scenario, builtin_scenario, create_app, load_scenario
from prefect_ito.simulator.builtins import BUILTIN_NAMES
from prefect_ito.simulator.server import SimUvicorn, bound_socket


def resolve_scenario(scenario: str | None) -> Scenario:
    """Return a built-in scenario by name, or load one from a JSON or YAML file.

    Raises:
        InvalidParameters: the file cannot be read, is not JSON or YAML, or is not a valid
            scenario; the message names the file and the first broken field.
    """
    if scenario is None:
        return builtin_scenario("default")
    if scenario in BUILTIN_NAMES:
        return builtin_scenario(scenario)
    if not Path(scenario).exists():
        raise InvalidParameters(
            f"scenario: neither a built-in scenario nor a scenario file ({scenario!r}); "
            f"built-in: {', '.join(BUILTIN_NAMES)}",
            field="scenario",
        )
    try:
        return load_scenario(Path(scenario))
    except ValidationError as exc:
        reason = str(invalid_parameters(exc))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        reason = f"not valid {'JSON' if isinstance(exc, ValueError) else 'YAML'}{_where(exc)}"
    except (OSError, UnicodeDecodeError) as exc:
        reason = f"cannot be read ({getattr(exc, 'strerror', None) or type(exc).__name__})"
    raise InvalidParameters(f"scenario {scenario}: {reason}", field="scenario")


def _where(error: Exception) -> str:
    """Return where in the file a JSON or YAML error is, as " (line L, column C)", if known."""
    mark = getattr(error, "problem_mark", None)
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    line = getattr(error, "lineno", line)
    column = getattr(error, "colno", column)
    return f" (line {line}, column {column})" if line is not None else ""


def simulator(
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    scenario: str | None = None,
    scaffold: bool = False,
    time_scale: float | None = None,
    login_scopes: list[str] | None = None,
) -> None:
    """Serve the reference desk simulator (no trainer, no model) until interrupted.

    Args:
        host: Interface to bind; loopback by default.
        port: TCP port to listen on.
        scenario: A built-in scenario name or a JSON/YAML scenario file (default: ``default``).
        scaffold: Answer like production today: training runs are not live.
        time_scale: Simulated seconds per real second, a finite number above 0 (default: the
            scenario's).
        login_scopes: The scopes a device login grants, to try a limited token (repeat it;
            default: every scope).
    """
    if not 0 <= port <= 65535:
        exit_with(InvalidParameters(f"port: {port} is not a TCP port (0-65535)", field="port"))
    if time_scale is not None:
        require_positive("time_scale", time_scale)
    try:
        chosen = resolve_scenario(scenario).with_options(
            scaffold=scaffold or None,
            time_scale=time_scale,
            login_scopes=None if login_scopes is None else _scopes(login_scopes),
        )
    except ValidationError as error:  # an option the scenario's own rules refuse
        exit_with(invalid_parameters(error))
    except InvalidParameters as error:
        exit_with(error)
    # Bound before the banner: it names the port clients reach (port 0 picks one), and a port
    # that cannot be bound is one line, not a banner followed by uvicorn's error.
    try:
        sock = bound_socket(host, port)
    except OSError as error:
        why = f"port: cannot listen on {host}:{port}: {error.strerror}"
        exit_with(InvalidParameters(why, field="port"))
    print(banner(chosen.name, host, sock.getsockname()[1]), flush=True)
    SimUvicorn(create_app(chosen), host, port, log_level="info").run(sockets=[sock])


def banner(scenario: str, host: str, port: int) -> str:
    """Return what the command prints first: where the simulator serves, and how to log in to it.

    Never a token or a passphrase: the way to a token is the device login the simulator serves,
    which keeps the token in the OS keyring, and a person's passphrase is the scenario's.
    """
    url = f"http://{_reachable(host)}:{port}"
    return (
        f"Itô desk simulator ({scenario}) on {url}; contract under /v0\n"
        "To get a token for it, in another shell (a device login: on the page it shows, sign "
        "in as a person of the scenario, whose passphrases docs/simulator.md gives, and "
        "approve):\n"
        f"  export ITO_COMPUTE_API_URL={url}\n"
        "  prefect-ito login"
    )


def _reachable(host: str) -> str:
    """Return the host a client on this machine uses for ``host``, bracketed if IPv6.

    A simulator bound to every interface (``0.0.0.0``, ``::``) is reached on loopback.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host  # a name, such as localhost
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    return f"[{address}]" if address.version == 6 else str(address)


def _scopes(names: list[str]) -> list[Scope]:
    """Return the scopes named, or end the command naming the one that is not a scope."""
    known = {scope.value: scope for scope in Scope}
    for name in names:
        if name not in known:
            exit_with(
                InvalidParameters(
                    f"--login-scopes: {name!r} is not a scope; give any of {', '.join(known)}",
                    field="login_scopes",
                )
            )
    return [known[name] for name in names]
