"""The simulator checks manifest digests in RFC 8785 form, as a backend in any language would."""

from __future__ import annotations

import hashlib
import json

import rfc8785

MANIFEST_FIELDS = ("booking_id", "model_size", "data_refs", "target", "budget_usd", "post_training")


def _body(digest_of) -> dict:
    body = {
        "booking_id": "bk-h200-2x8-ib",
        "model_size": "8B",
        "data_refs": ["catalog://fineweb-edu", "s3://données/😀"],
        "target": "chat assistant",
        "budget_usd": 250000.0,
        "post_training": None,
    }
    body["manifest_digest"] = "sha256:" + hashlib.sha256(digest_of(body)).hexdigest()
    return body


def test_a_digest_made_by_an_independent_rfc_8785_implementation_is_accepted(desk):
    response = desk.submit(_body(rfc8785.dumps), key="jcs")

    assert response.status_code == 201, response.text


def test_a_python_json_dumps_digest_is_refused(desk):
    def python_style(body: dict) -> bytes:
        fields = {name: body[name] for name in MANIFEST_FIELDS}
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode()

    response = desk.submit(_body(python_style), key="python")

    assert response.status_code == 422
    assert response.json()["error"]["field"] == "manifest_digest"
