"""``python -m prefect_ito.cli``: the same as the ``prefect-ito`` command."""

from prefect_ito.cli import main

main()
