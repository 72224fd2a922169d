"""Prefect blocks: where the Itô backend is, and which completed booking to train on.

Neither block holds a secret. :class:`ItoCredentials` says which backend and which keyring entry
to use, and resolves the token only when :meth:`ItoCredentials.get_client` is called (see
:mod:`prefect_ito.auth`), so the block document Prefect stores never contains it.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.abstract import CredentialsBlock
from prefect.blocks.core import Block
from pydantic import Field, ValidationError, field_validator

from prefect_ito.auth import normalise_api_url, resolve_api_url, resolve_token
from prefect_ito.client import ItoClient
from prefect_ito.exceptions import InvalidParameters, ItoError

__all__ = ["ItoBooking", "ItoCredentials", "resolve_credentials"]

_DOCS_URL = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/credentials.md"


class ItoCredentials(CredentialsBlock):
    """Where an Itô desk backend is, and which keyring entry holds its token (never the token).

    The token is resolved when a client is made: from ``ITO_COMPUTE_TOKEN`` in the process's own
    environment, else from the OS keyring entry that ``prefect-ito login`` wrote.

    Example:
        Load a saved block and talk to the backend:
        ```python
        from prefect_ito.blocks import ItoCredentials

        credentials = ItoCredentials.load("BLOCK_NAME")
        async with credentials.get_client() as client:
            print(await client.get_capabilities())
        ```
    """

    _block_type_name = "Itô Credentials"
    _block_type_slug = "ito-credentials"
    _logo_url = None
    _description = (
        "The Itô desk backend to delegate training to, and the keyring entry holding its token. "
        "Holds no secret: log in once per machine with `prefect-ito login`."
    )
    _documentation_url = _DOCS_URL  # type: ignore[assignment]

    api_url: str = Field(
        description="Root URL of the Itô desk backend, e.g. https://desk.example.com.",
    )
    keyring_entry: str | None = Field(
        default=None,
        description="Keyring entry (service prefect-ito) to read the token from; "
        "defaults to the backend URL.",
    )
    timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Read, write and pool timeout of each request, in seconds; when unset, "
        "the PREFECT_INTEGRATIONS_ITO_REQUEST_TIMEOUT_SECONDS setting (30 by default).",
    )

    @field_validator("api_url")
    @classmethod
    def _normalise(cls, value: str) -> str:
        # A ValueError, so that pydantic names the field: a block built from a flow run's
        # parameters or a form then fails as invalid input naming api_url.
        try:
            return normalise_api_url(value)
        except ItoError as error:
            raise ValueError(str(error)) from None

    def get_client(self) -> ItoClient:
        """Return a client for the backend, with the token resolved now.

        Raises:
            NotLoggedIn: No token in the environment or the keyring.
            InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
        """
        return ItoClient.from_settings(
            self.api_url,
            resolve_token(self.api_url, keyring_entry=self.keyring_entry),
            timeout_seconds=self.timeout_seconds,
        )


class ItoBooking(Block):
    """A completed Itô compute booking, as an ito-compute booking flow hands it over.

    This is what the booking flow says it booked; only the backend's training-eligibility answer
    proves the booking may train. Node IPs and the SSH user are informational: prefect-ito never
    connects to a node and never holds SSH key material.

    Example:
        Load a saved booking:
        ```python
        from prefect_ito.blocks import ItoBooking

        booking = ItoBooking.load("BLOCK_NAME")
        print(booking.booking_id, booking.gpu_sku)
        ```
    """

    _block_type_name = "Itô Booking"
    _block_type_slug = "ito-booking"
    _logo_url = None
    _description = "A completed Itô compute GPU booking to run training on."
    _documentation_url = _DOCS_URL  # type: ignore[assignment]

    booking_id: str = Field(min_length=1, description="The booking's id at the Itô desk.")
    gpu_sku: str = Field(description="The GPU model booked, e.g. H200.")
    node_count: int = Field(ge=1, description="Number of nodes booked.")
    gpus_per_node: int = Field(ge=1, description="GPUs on each node.")
    fabric: str = Field(description="The interconnect between nodes, e.g. InfiniBand.")
    region: str | None = Field(default=None, description="Where the nodes are, if known.")
    account: str | None = Field(
        default=None,
        description="The Itô account that holds the booking, if the booking flow said; "
        "training refuses a booking the backend does not place in the same account.",
    )
    node_ips: list[str] = Field(
        default_factory=list,
        description="The nodes' IP addresses, for information only.",
    )
    ssh_user: str | None = Field(
        default=None,
        description="The SSH user of the nodes, for information only (no key is ever held).",
    )


async def resolve_credentials(
    credentials: ItoCredentials | str | dict[str, Any] | None,
) -> ItoCredentials:
    """Return the credentials block: given, loaded by name, or for ``ITO_COMPUTE_API_URL``.

    A dict is a block's fields as Prefect stores a flow run's parameters.

    Raises:
        InvalidParameters: no block has that name, or the fields are not a block's.
        ItoError: nothing names a backend (no block and no ``ITO_COMPUTE_API_URL``).
    """
    if isinstance(credentials, ItoCredentials):
        return credentials
    if isinstance(credentials, str):
        try:
            return await ItoCredentials.aload(credentials)
        except ValueError as exc:
            raise InvalidParameters(
                f"credentials: no ItoCredentials block named {credentials!r}"
            ) from exc
    if isinstance(credentials, dict):
        try:
            return ItoCredentials.model_validate(credentials)
        except ValidationError as exc:
            # Imported here: parameters imports this module for ItoBooking.
            from prefect_ito.parameters import invalid_parameters

            raise InvalidParameters(f"credentials.{invalid_parameters(exc)}") from None
    try:
        return ItoCredentials(api_url=resolve_api_url(None))
    except ItoError as error:
        raise InvalidParameters(f"credentials: {error}") from None
