"""Prefect blocks: where the Itô backend is, which completed booking to train on, and who stands
behind unattended spend.

No block holds a secret. :class:`ItoCredentials` says which backend and which keyring entry
to use, and resolves the token only when :meth:`ItoCredentials.get_client` is called (see
:mod:`prefect_ito.auth`), so the block document Prefect stores never contains it.
"""

from __future__ import annotations

import fnmatch
from datetime import UTC, datetime
from typing import Any, TypeVar

from prefect.blocks.abstract import CredentialsBlock
from prefect.blocks.core import Block
from pydantic import Field, ValidationError, field_validator, model_validator

from prefect_ito.auth import check_keyring_label, normalise_api_url, resolve_api_url, resolve_token
from prefect_ito.client import ItoClient
from prefect_ito.contract import TrainingQuote, TrainingRequest
from prefect_ito.exceptions import InvalidParameters, ItoError
from prefect_ito.origins import admit

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


class ItoCredentials(CredentialsBlock):
    """Where an Itô desk backend is, and which keyring entry holds its token (never the token).

    The token is resolved when a client is made: from ``ITO_COMPUTE_TOKEN`` in the process's own
    environment when ``ITO_COMPUTE_API_URL`` names this block's origin, else from the OS keyring
    entry that ``prefect-ito login`` wrote for that origin. Anyone with access to the Prefect API
    can write a block, so a client is made only for an origin this process is configured for
    (``ITO_COMPUTE_API_URL`` or ``ITO_COMPUTE_ALLOWED_ORIGINS``; see :mod:`prefect_ito.origins`).

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

    def get_client(self) -> ItoClient:
        """Return a client for the backend, with the token resolved now.

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
    from prefect_ito.parameters import invalid_parameters  # parameters imports this module

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
    run stops before its first request (see :mod:`prefect_ito.origins`).

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


class ItoSpendAuthorization(Block):
    """A person's standing authorization to spend on unattended training runs, within limits.

    A schedule or a trigger has nobody to confirm a spend. A person creates this block in
    advance; a training flow run that names it confirms on that person's behalf when a request
    is within every limit (the backend records who authorized it), and asks a person otherwise.

    Example:
        Name a saved authorization in a training flow run:
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
        "A person's standing authorization to spend on unattended Itô training runs: who, "
        "the most per run, which bookings, targets and model sizes, and until when."
    )
    _documentation_url = _FLOWS_DOCS_URL  # type: ignore[assignment]

    authorized_by: str = Field(
        min_length=1,
        description="Who authorizes the spend; the backend records this name for each run.",
    )
    max_budget_usd: float = Field(
        gt=0,
        allow_inf_nan=False,
        description="The largest budget_usd a run may have, in US dollars (a finite amount).",
    )
    booking_ids: list[str] = Field(
        min_length=1,
        description="Bookings the authorization covers, by id or shell-style pattern (bk-h200-*).",
    )
    targets: list[str] = Field(
        default_factory=list, description="Targets it covers; empty covers any target."
    )
    model_sizes: list[str] = Field(
        default_factory=list, description="Model sizes it covers (8B…); empty covers any size."
    )
    expires_at: datetime = Field(
        description="When the authorization ends, with a time zone (e.g. 2027-01-31T00:00:00Z)."
    )
    note: str | None = Field(default=None, description="Why it was given, for the record.")

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("expires_at needs a time zone, e.g. 2027-01-31T00:00:00Z")
        return value

    @field_validator("authorized_by")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name who authorizes the spend, not be blank")
        return value

    @field_validator("booking_ids", "targets", "model_sizes")
    @classmethod
    def _no_blank_entry(cls, values: list[str]) -> list[str]:
        # A blank pattern covers nothing; in a list a person wrote, it is a slip, not a choice.
        if any(not value.strip() for value in values):
            raise ValueError("holds a blank entry; each entry is an id, a value or a pattern")
        return values

    @property
    def label(self) -> str:
        """The name the backend records beside the person: the block's, once saved or loaded."""
        return getattr(self, "_block_document_name", None) or "(unsaved)"

    def not_covered(
        self,
        request: TrainingRequest,
        quote: TrainingQuote | None = None,
        *,
        now: datetime | None = None,
    ) -> list[str]:
        """Return why ``request`` (and its ``quote``) is not covered; empty when it is.

        Without a quote only the request's own limits are weighed; with one, also the backend's
        plan (a refused plan) and the booking's term (a run that may outlast it).
        """
        reasons = [reason for reason in self._request_limits(request, now) if reason]
        if quote is not None:
            if quote.plan.parallelism.refused:
                reasons.append(f"the backend refuses the plan ({quote.plan.parallelism.reason})")
            if not quote.ends_before_term:
                reasons.append(
                    f"the run may outlast the booking's term, which ends "
                    f"{quote.term_end.isoformat()}"
                )
        return reasons

    def _request_limits(self, request: TrainingRequest, now: datetime | None) -> list[str]:
        moment = now or datetime.now(UTC)
        booking = request.booking_id
        return [
            f"it expired at {self.expires_at.isoformat()}" if self.expires_at <= moment else "",
            f"the budget ${request.budget_usd:,.2f} is above its ${self.max_budget_usd:,.2f} "
            "per run"
            if request.budget_usd > self.max_budget_usd
            else "",
            f"booking {booking} is not among its bookings ({', '.join(self.booking_ids)})"
            if not any(fnmatch.fnmatchcase(booking, p) for p in self.booking_ids)
            else "",
            f"target {request.target!r} is not among its targets"
            if self.targets and request.target not in self.targets
            else "",
            f"model size {request.model_size} is not among its sizes "
            f"({', '.join(self.model_sizes)})"
            if self.model_sizes and request.model_size not in self.model_sizes
            else "",
        ]


async def resolve_authorization(
    authorization: ItoSpendAuthorization | str | dict[str, Any] | None,
) -> ItoSpendAuthorization | None:
    """Return the standing authorization: given, loaded by name, or None.

    A dict is a block's fields as Prefect stores a flow run's parameters.

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
