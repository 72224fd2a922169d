"""Which backend run a request made: the backend's answer, never a record kept in Prefect.

A supervisor follows, decides on and cancels only a run the backend says this very request
made — its client reference is the supervisor's (the flow run's id), or it was made under the
idempotency key this same request derives (running the same command again after a crash). A
record written in Prefect (which anyone with Prefect API access can write) only ever names a
run to look at: it is never what decides which run a flow run follows.
"""

from __future__ import annotations

import logging
import uuid

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import TrainingRequest, TrainingRun
from prefect_ito.exceptions import (
    BookingBusy,
    ClientReferenceInUse,
    IdempotencyKeyReused,
    RunNotFound,
)

__all__ = [
    "Logger",
    "asks_its_questions",
    "find_attachable_run",
    "find_keyed_run",
    "find_referenced_run",
    "find_submitted_run",
    "owner_of",
]

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
_logger = logging.getLogger(__name__)


async def find_attachable_run(
    client: ItoClient,
    request: TrainingRequest,
    idempotency_key: str | None = None,
    client_reference: str | None = None,
    logger: Logger = _logger,
    recorded: str | None = None,
) -> TrainingRun | None:
    """Return the run this very request made — by its client reference, else its key — or None.

    The run ``client_reference`` made comes first, finished or not, however long ago it was
    submitted. The run ``idempotency_key`` made is looked up next, within the key's retention: a
    person sending the same key again attaches to it, and nobody is asked to confirm a spend
    that cannot happen again. ``recorded`` is the run a Prefect record names: on a backend that
    keeps client references it is ignored (the reference said which run is ours), and said so;
    on one that does not, it counts only if it is a run of this booking and manifest.

    A booking with an unfinished run this request did not make is busy, even for the same
    manifest: that run is another submission's to follow (``prefect-ito attach``), and a second
    follower would ask its questions twice. The run the same idempotency key made is followed
    even when another client reference made it (a scheduler starting a job twice): the same
    submission, whose questions the flow run that made it asks (:func:`asks_its_questions`).
    A backend without references cannot tell whose an unfinished run is; there the booking's
    run of the same manifest is followed, as before contract v0.3.

    Raises:
        ClientReferenceInUse: ``client_reference`` already made a run of a different request.
        BookingBusy: the booking has an unfinished run this request did not make.
        IdempotencyKeyReused: ``idempotency_key`` already made a run of a different request.
    """
    references = await references_kept(client, logger)
    if references and client_reference is not None:
        referenced = await find_referenced_run(client, request, client_reference)
        if referenced is not None:
            return referenced
    keyed = await find_keyed_run(client, request, idempotency_key)
    if keyed is not None:
        return keyed
    if recorded is not None:
        confirmed = await _recorded_run(client, request, recorded, references, logger)
        if confirmed is not None:
            return confirmed
    return await _unfinished_on_booking(client, request, references)


def asks_its_questions(run: TrainingRun, client_reference: str | None) -> bool:
    """Tell whether a supervisor with ``client_reference`` puts ``run``'s questions to people.

    Only the submission the backend says made the run asks them: one question per backend
    question, however many supervisors follow the run. A run under another client reference
    (found by an idempotency key two flow runs were given) is followed without asking; a run
    without one (a backend that keeps none, or a submission outside a flow run) is asked
    about, as before contract v0.3, since nobody can say whose it is.
    """
    made_by = run.client_reference
    return made_by is None or made_by == client_reference


def owner_of(run: TrainingRun) -> str:
    """Say who asks ``run``'s questions: the flow run, by the client reference that made it."""
    return _maker(run)


async def find_submitted_run(
    client: ItoClient,
    request: TrainingRequest,
    idempotency_key: str,
    client_reference: str,
    logger: Logger = _logger,
) -> TrainingRun | None:
    """Return the run one submission made, and never another submission's run.

    What a cancel of a flow run may stop: on a backend that keeps client references, only the
    run whose reference is the flow run's id (a key can be copied into another flow run's
    parameters, a reference cannot be made by another flow run); on one that does not, the run
    the submission's key made.

    Raises:
        ClientReferenceInUse, IdempotencyKeyReused: the reference or the key made a run of a
            different request.
    """
    if await references_kept(client, logger):
        return await find_referenced_run(client, request, client_reference)
    return await find_keyed_run(client, request, idempotency_key)


async def find_keyed_run(
    client: ItoClient, request: TrainingRequest, idempotency_key: str | None
) -> TrainingRun | None:
    """Return the run ``idempotency_key`` made, finished or not, within the key's retention.

    Raises:
        IdempotencyKeyReused: the key made a run of a different request.
    """
    if idempotency_key is None:
        return None
    earlier = await client.find_run_by_idempotency_key(idempotency_key)
    if earlier is not None and earlier.manifest_digest != (digest := request.digest()):
        raise IdempotencyKeyReused(
            f"idempotency key {idempotency_key} already made run {earlier.run_id} of another "
            f"manifest ({earlier.manifest_digest}); this request is {digest}"
        )
    return earlier


async def find_referenced_run(
    client: ItoClient, request: TrainingRequest, client_reference: str
) -> TrainingRun | None:
    """Return the run submitted with ``client_reference``, finished or not, or None.

    Ask only a backend that keeps references (:func:`references_kept`).

    Raises:
        ClientReferenceInUse: the reference made a run of a different request.
    """
    runs = await client.find_runs_by_client_reference(client_reference)
    if not runs:
        return None
    run, digest = runs[0], request.digest()
    if run.manifest_digest != digest:
        raise ClientReferenceInUse(
            f"client reference {client_reference} already made run {run.run_id} of another "
            f"manifest ({run.manifest_digest}); this request is {digest}, and nothing is "
            "submitted again under that reference"
        )
    return run


async def references_kept(client: ItoClient, logger: Logger = _logger) -> bool:
    """Tell whether the backend keeps client references (``Capabilities.client_reference``,
    contract v0.3); say in ``logger`` what finding a run goes by when it does not."""
    if (await client.get_capabilities()).client_reference:
        return True
    logger.info(
        "The backend does not advertise client references (contract v0.3): finding this "
        "request's run goes by the idempotency key, which a backend keeps for at least 24 hours, "
        "and the booking's unfinished run."
    )
    return False


async def _recorded_run(
    client: ItoClient,
    request: TrainingRequest,
    recorded: str,
    references: bool,
    logger: Logger,
) -> TrainingRun | None:
    """Return the run a Prefect record names, only where the backend cannot say whose runs are."""
    if references:
        logger.warning(
            "This flow run's record in Prefect names backend run %s, which the backend does not "
            "say this request made (neither its client reference nor its idempotency key): the "
            "record is ignored. Anyone with Prefect API access can write such a record.",
            recorded,
        )
        return None
    try:
        run = await client.get_training_run(recorded)
    except RunNotFound:
        return None
    if run.booking_id == request.booking_id and run.manifest_digest == request.digest():
        return run
    logger.warning(
        "This flow run's record in Prefect names backend run %s, a run of another booking or "
        "manifest: the record is ignored.",
        recorded,
    )
    return None


async def _unfinished_on_booking(
    client: ItoClient, request: TrainingRequest, references: bool
) -> TrainingRun | None:
    """Return None when the booking is free; raise BookingBusy when it is not (see above)."""
    digest = request.digest()
    for run in await client.list_active_runs(request.booking_id):
        if run.manifest_digest != digest:
            raise BookingBusy(
                f"booking {request.booking_id} is busy with run {run.run_id} "
                f"({run.manifest_digest}); this request is {digest}"
            )
        if not references:
            return run
        raise BookingBusy(_busy_with(request, run, "of this same request"))
    return None


def _busy_with(request: TrainingRequest, run: TrainingRun, how: str) -> str:
    """Say that the booking's unfinished run is another submission's, whose, and what to do."""
    return (
        f"booking {request.booking_id} already has an unfinished run {run.run_id} {how}, "
        f"which {_maker(run)} made: nothing was quoted or submitted, and no question of that "
        f"run is asked here (they are that flow run's); follow it with "
        f"`prefect-ito attach {run.run_id}`"
    )


def _maker(run: TrainingRun) -> str:
    """Say who submitted ``run``: prefect-ito's client reference is a flow run's id."""
    reference = run.client_reference
    if reference is None:
        return "another submission"
    try:
        return f"flow run {uuid.UUID(reference)}"
    except ValueError:
        return f"another submission (client reference {reference})"
