"""Fixtures for the flows tests that run flows: a simulator per test."""

from simulator_fixture import start_simulator, worker_environment

__all__ = ["start_simulator", "worker_environment"]
