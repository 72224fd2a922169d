"""Table tests for ``data_ref_matches(pattern, data_ref)``: which data a standing authorization's
``data_ref_patterns`` cover (docs/contract.md, "POST /v0/spend-authorizations")."""

from __future__ import annotations

import pytest

from prefect_ito.contract import data_ref_matches

CORPUS = "s3://team-bucket/corpus/*"

CASES = [
    (CORPUS, "s3://team-bucket/corpus/web", True),
    (CORPUS, "s3://team-bucket/corpus/web/2026-10/shard-0.jsonl", True),
    (CORPUS, "s3://team-bucket/corpus/", True),
    (CORPUS, "s3://team-bucket/corpus", False),
    (CORPUS, "s3://team-bucket/corpus-evil/web", False),
    (CORPUS, "s3://team-bucket/poisoned-corpus/", False),
    (CORPUS, "S3://TEAM-BUCKET/CORPUS/web", False),
    (CORPUS, "s3://team-bucket/corpus/../poisoned-corpus/", False),
    (CORPUS, "s3://team-bucket/corpus/./web", False),
    (CORPUS, "s3://team-bucket/corpus/..", False),
    (CORPUS, "s3://team-bucket/corpus/%2e%2e/poisoned-corpus/", False),
    (CORPUS, "s3://team-bucket/corpus/web%2F..%2Fevil", False),
    (CORPUS, "s3://team-bucket/corpus/..\\poisoned-corpus", False),
    (CORPUS, "s3://team-bucket/corpus//poisoned-corpus", False),
    (CORPUS, "s3://team-bucket/corpus/web?versionId=1", False),
    (CORPUS, "s3://team-bucket/corpus/web#x", False),
    ("s3://team-bucket/corpus/", "s3://team-bucket/corpus/", True),
    ("s3://team-bucket/corpus/", "s3://team-bucket/corpus/web", False),
    ("catalog://fineweb-edu", "catalog://fineweb-edu", True),
    ("catalog://fineweb-edu", "catalog://fineweb-edu-v2", False),
    ("catalog://*", "catalog://fineweb-edu", True),
    ("catalog://*", "s3://team-bucket/catalog://x", False),
    ("*", "s3://anything/at/all", True),
    ("*", "s3://anything/../at/all", False),
    ("s3://team-bucket/corpus/shard-?", "s3://team-bucket/corpus/shard-7", True),
    ("s3://team-bucket/corpus/shard-[0-3]", "s3://team-bucket/corpus/shard-7", False),
]


@pytest.mark.parametrize(("pattern", "data_ref", "matches"), CASES, ids=str)
def test_data_ref_matches(pattern: str, data_ref: str, matches: bool):
    assert data_ref_matches(pattern, data_ref) is matches
