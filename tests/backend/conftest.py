"""Fixtures for the backend tests: tokens, keyrings and a simulator."""

from token_fixtures import _no_token_env, file_keyring, memory_keyring, sim

__all__ = ["_no_token_env", "file_keyring", "memory_keyring", "sim"]
