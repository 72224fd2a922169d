"""A request body over the limit is refused while it is read (413), and the simulator serves on.

Over real loopback sockets, so the server's own reading is what is tested: a ``Content-Length``
over the limit is answered before any of the body is read, and a chunked body is counted as it
arrives.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from prefect_ito.contract import ErrorCode
from prefect_ito.simulator.scenario import DEFAULT_MAX_BODY_BYTES

LIMIT = DEFAULT_MAX_BODY_BYTES


def _connect(desk: Any) -> socket.socket:
    where = urlsplit(desk.sim.url)
    conn = socket.create_connection((where.hostname, where.port), timeout=10)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _head(desk: Any, **headers: str) -> bytes:
    lines = [
        "POST /v0/training-quotes HTTP/1.1",
        f"Host: {urlsplit(desk.sim.url).netloc}",
        f"Authorization: Bearer {desk.token}",
        "Content-Type: application/json",
        *(f"{name.replace('_', '-')}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(conn: socket.socket) -> tuple[int, dict[str, Any]]:
    """Read one HTTP/1.1 answer (with a Content-Length) and return its status and JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "connection closed inside the answer"
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        piece = b" " * min(size, total - sent)
        sent += len(piece)
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"


def _refused(status: int, body: dict[str, Any]) -> None:
    assert status == 413, body
    assert body["ok"] is False and body["live_api_contacted"] is False
    assert body["error"]["code"] == ErrorCode.PAYLOAD_TOO_LARGE.value
    assert body["error"]["field"] == "body"
    assert str(LIMIT) in body["error"]["message"] or f"{LIMIT:,}" in body["error"]["message"]


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(desk):
    # 100 MB announced, 10 bytes sent: before, the simulator waited to read all of it.
    with _connect(desk) as conn:
        conn.sendall(_head(desk, Content_Length=str(100 * 1024 * 1024)) + b'{"booking"')
        started = time.monotonic()
        status, body = _answer(conn)

    _refused(status, body)
    assert time.monotonic() - started < 5
    assert desk.quote().status_code == 201  # the simulator serves on


def test_a_chunked_body_is_counted_as_it_arrives(desk):
    with _connect(desk) as conn:
        conn.sendall(_head(desk, Transfer_Encoding="chunked"))
        try:
            for chunk in _chunks(LIMIT + 256 * 1024):
                conn.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were still sending: the answer is waiting
        status, body = _answer(conn)

    _refused(status, body)
    assert desk.quote().status_code == 201


def test_a_body_within_the_limit_is_read_as_before(desk):
    padded = json.dumps(desk.body()) + " " * (LIMIT // 2)  # JSON may end in blanks

    response = desk.http.post(
        "/v0/training-quotes", content=padded, headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 201, response.text


@pytest.mark.parametrize("limit", [1024])
def test_the_limit_is_a_scenario_setting(desk_for, limit):
    from prefect_ito.simulator import builtin_scenario

    scenario = builtin_scenario("default").model_copy(update={"max_body_bytes": limit})
    small = desk_for(scenario)

    response = small.http.post(
        "/v0/training-quotes",
        content=json.dumps(small.body()) + " " * limit,
        headers={"Content-Type": "application/json"},
    )

    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert small.quote().status_code == 201
