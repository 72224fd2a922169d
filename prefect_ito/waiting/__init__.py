"""Waiting without a process.

Deferral between gates, the records a suspended flow run keeps, the watcher that resumes it,
recovery after a lost machine, cancellation, and what prefect-ito asks Prefect about flow runs.
"""
