"""Asking people.

The Prefect pauses and forms that put a spend or a proposed restart to a person, and reading
the answers back from Prefect's own records.
"""
