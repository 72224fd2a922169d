"""Supervising one backend run.

The loop (:mod:`~prefect_ito.supervision.loop`), each of its steps as a Prefect task or a
plain call over one client (:mod:`~prefect_ito.supervision.tasks`), and how a run's end becomes
a typed outcome, a Prefect state and an exit code.
"""
