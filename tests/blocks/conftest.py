"""Fixtures for the block tests: tokens and keyrings."""

from token_fixtures import _no_token_env, memory_keyring

__all__ = ["_no_token_env", "memory_keyring"]
