"""Talking to the Itô desk backend.

The HTTP client with its retries and paging, where the backend URL and the token come from
(keyring, environment, device login), which origins a token may go to, and the backend's rules
for each operation (:mod:`~prefect_ito.backend.desk`). Nothing here imports Prefect's flow
machinery.
"""
