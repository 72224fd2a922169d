"""Prefect blocks: where the Itô backend is, which completed booking to train on, and who stands
behind unattended spend.

No block holds a secret. :class:`ItoCredentials` says which backend and which keyring entry
to use, and resolves the token only when :meth:`ItoCredentials.get_client` is called (see
:mod:`prefect_ito.backend.auth`), so the block document Prefect stores never contains it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from prefect.blocks.abstract import CredentialsBlock
from prefect.blocks.core import Block
from prefect.client.orchestration import PrefectClient
from prefect.exceptions import ObjectAlreadyExists
from pydantic import Field, ValidationError, field_validator, model_validator

from prefect_ito.backend.auth import (
    check_keyring_label,
    normalise_api_url,
    resolve_api_url,
    resolve_token,
)
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.origins import admit
from prefect_ito.contract import ID_MAX_LENGTH
from prefect_ito.exceptions import InvalidParameters, ItoError, invalid_parameters

__all__ = [
    "ItoBooking",
    "ItoCredentials",
    "ItoSpendAuthorization",
    "resolve_authorization",
    "resolve_credentials",
]

B = TypeVar("B", bound=Block)

_DOCS_URL = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/credentials.md"
_FLOWS_DOCS_URL = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/flows.md"


class _RegistersOnce:
    """Registering a block type and schema that another process registers at the same moment.

    Prefect reads the type, finds none, and creates it; when two processes do so at once (a
    fresh server whose first flow runs start together, each saving a block parameter), the
    second create is refused as already existing and that flow run fails. Registering again then
    finds what the other process made, which is all that was wanted.
    """

    @classmethod
    async def aregister_type_and_schema(cls, client: PrefectClient | None = None) -> None:
        register = super().aregister_type_and_schema  # type: ignore[misc]
        try:
            await register(client=client)
        except ObjectAlreadyExists:
            await register(client=client)


class ItoCredentials(_RegistersOnce, CredentialsBlock):
    """Where an Itô desk backend is, and which keyring entry holds its token (never the token).

    The token is resolved when a client is made: from ``ITO_COMPUTE_TOKEN`` in the process's own
    environment when ``ITO_COMPUTE_API_URL`` names this block's origin, else from the OS keyring
    entry that ``prefect-ito login`` wrote for that origin. Anyone with access to the Prefect API
    can write a block, so a client is made only for an origin this process is configured for
    (``ITO_COMPUTE_API_URL`` or ``ITO_COMPUTE_ALLOWED_ORIGINS``; see
    :mod:`prefect_ito.backend.origins`).

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
        description="A label for a second login at the same backend (keyring entry "
        "<origin>#<label>, service prefect-ito); by default the backend's own entry.",
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

    @model_validator(mode="after")
    def _same_origin_entry(self) -> ItoCredentials:
        # A label can never spell another origin's entry: the token for api_url is the only one.
        try:
            self.keyring_entry = check_keyring_label(self.keyring_entry, self.api_url)
        except ItoError as error:
            raise ValueError(str(error)) from None
        return self

    def get_client(self, *, max_retries: int | None = None) -> ItoClient:
        """Return a client for the backend, with the token resolved now.

        Args:
            max_retries: Overrides the setting's retries for this client (0: one attempt).

        Raises:
            OriginNotAllowed: This process is configured for other backends only.
            NotLoggedIn: No token in the environment or the keyring.
            InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
        """
        admit(self.api_url, source="the ItoCredentials block")
        return ItoClient.from_settings(
            self.api_url,
            resolve_token(self.api_url, keyring_entry=self.keyring_entry),
            timeout_seconds=self.timeout_seconds,
            max_retries=max_retries,
        )


class ItoBooking(_RegistersOnce, Block):
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


async def aload_checked(block_type: type[B], name: str, parameter: str) -> B:
    """Load the saved block ``name``, or say in one line which rule its document breaks.

    Anyone with Prefect API access writes block documents through the API, past the block's own
    checks, so a stored document is validated here as any other input is.

    Raises:
        InvalidParameters: No such block, or its document breaks a rule (naming the field).
    """
    try:
        return await block_type.aload(name)
    except RuntimeError as exc:  # how Prefect reports a stored document that fails validation
        if not isinstance(exc.__cause__, ValidationError):
            raise
        which = f"the {block_type.__name__} block {name!r}"
        raise invalid_block(exc.__cause__, parameter, which) from None
    except ValueError as exc:
        raise InvalidParameters(
            f"{parameter}: no {block_type.__name__} block named {name!r}", field=parameter
        ) from exc


def invalid_block(error: ValidationError, parameter: str, which: str) -> InvalidParameters:
    """Return the refusal of a block whose fields break a rule, naming the field.

    Args:
        error: What the block's model said.
        parameter: The flow parameter or option the block came through.
        which: Which block, for the message ("the ItoCredentials block 'desk'").
    """
    broken = invalid_parameters(error)
    field = f"{parameter}.{broken.field}" if broken.field else parameter
    where = f"{field}: " if not broken.field else f"{parameter}."
    return InvalidParameters(f"{where}{broken} ({which})", field=field)


async def resolve_credentials(
    credentials: ItoCredentials | str | dict[str, Any] | None,
) -> ItoCredentials:
    """Return the credentials block: given, loaded by name, or for ``ITO_COMPUTE_API_URL``.

    A dict is a block's fields as Prefect stores a flow run's parameters. Whatever names the
    backend, its origin must be one this process is configured for, checked here so that a flow
    run stops before its first request (see :mod:`prefect_ito.backend.origins`).

    Raises:
        InvalidParameters: no block has that name, or the fields are not a block's.
        OriginNotAllowed: the block names a backend this process is not configured for.
        ItoError: nothing names a backend (no block and no ``ITO_COMPUTE_API_URL``).
    """
    block = await _credentials_block(credentials)
    source = (
        f"the ItoCredentials block {credentials!r}"
        if isinstance(credentials, str)
        else "the credentials parameter"
    )
    admit(block.api_url, source=source)
    return block


async def _credentials_block(
    credentials: ItoCredentials | str | dict[str, Any] | None,
) -> ItoCredentials:
    if isinstance(credentials, ItoCredentials):
        return credentials
    if isinstance(credentials, str):
        return await aload_checked(ItoCredentials, credentials, "credentials")
    if isinstance(credentials, dict):
        try:
            return ItoCredentials.model_validate(credentials)
        except ValidationError as exc:
            raise invalid_block(exc, "credentials", "the credentials parameter") from None
    try:
        return ItoCredentials(api_url=resolve_api_url(None))
    except ItoError as error:
        raise InvalidParameters(f"credentials: {error}") from None


_V03_AUTHORIZATION_FIELDS = frozenset(
    {"authorized_by", "max_budget_usd", "booking_ids", "targets", "model_sizes", "expires_at"}
)


class ItoSpendAuthorization(_RegistersOnce, Block):
    """Names a person's standing authorization at the Itô desk backend, for unattended runs.

    A schedule or a trigger has nobody to confirm a spend. A person creates a standing
    authorization *at the backend* with their own token (``prefect-ito authorizations create``),
    with its limits; this block only names it. A training flow run that names it asks the
    backend to create its run under that authorization, and the backend alone decides whether
    the authorization covers the quote at that moment (and records who created it). When it
    does not, a person is asked. Anyone who can write this block can only point at another of
    the account's authorizations, never widen one.

    Example:
        Name a backend authorization (``prefect-ito authorizations list`` shows its id) in a
        training flow run:
        ```python
        from prefect_ito.blocks import ItoSpendAuthorization
        from prefect_ito.flows import ito_training

        authorization = ItoSpendAuthorization.load("BLOCK_NAME")
        await ito_training(training, credentials="desk", authorization=authorization)
        ```
    """

    _block_type_name = "Itô Spend Authorization"
    _block_type_slug = "ito-spend-authorization"
    _logo_url = None
    _description = (
        "Names a standing spend authorization a person created at the Itô desk backend "
        "(prefect-ito authorizations create); the backend checks its limits."
    )
    _documentation_url = _FLOWS_DOCS_URL  # type: ignore[assignment]

    authorization_id: str = Field(
        min_length=1,
        max_length=ID_MAX_LENGTH,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="The backend's id of the authorization (sa_…), as `prefect-ito "
        "authorizations list` shows it. Its limits live at the backend.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_inline_limits(cls, data: Any) -> Any:
        # Contract v0.3 kept the limits here, where any Prefect API user could write them.
        if isinstance(data, dict) and _V03_AUTHORIZATION_FIELDS & data.keys():
            raise ValueError(
                "limits written in Prefect are not taken: a standing authorization is a backend "
                "object a person creates (prefect-ito authorizations create); name it by "
                "authorization_id"
            )
        return data

    @property
    def label(self) -> str:
        """The block's name once saved or loaded, else the backend id."""
        return getattr(self, "_block_document_name", None) or self.authorization_id


async def resolve_authorization(
    authorization: ItoSpendAuthorization | str | dict[str, Any] | None,
) -> ItoSpendAuthorization | None:
    """Return the block naming a standing authorization: given, loaded by name, or None.

    A dict is a block's fields as Prefect stores a flow run's parameters; one carrying limits
    (contract v0.3's inline authorization) is refused.

    Raises:
        InvalidParameters: no block has that name, or the fields are not a block's.
    """
    if authorization is None or isinstance(authorization, ItoSpendAuthorization):
        return authorization
    if isinstance(authorization, str):
        return await aload_checked(ItoSpendAuthorization, authorization, "authorization")
    try:
        return ItoSpendAuthorization.model_validate(authorization)
    except ValidationError as exc:
        raise invalid_block(exc, "authorization", "the authorization parameter") from None
