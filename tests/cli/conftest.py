"""Fixtures for the CLI tests that run a flow in process (the terminal runner): a simulator per
test."""

from simulator_fixture import start_simulator

__all__ = ["start_simulator"]
