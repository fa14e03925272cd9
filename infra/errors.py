"""Errors raised while bringing local services up or down."""

from __future__ import annotations

import psycopg
import redis
from aiokafka.errors import KafkaError

from schemas.errors import AgentLedgerError

# The drivers' errors that mean "the service, or the way to it, failed for now": what a loop
# that applies, relays or reads in the background waits out and tries again.
TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    KafkaError,
    OSError,
)


def is_retriable(exc: BaseException) -> bool:
    """One answer for every retrying loop: a driver's transient error, or one of ours that
    says so (``retriable``)."""
    return isinstance(exc, TRANSIENT) or (isinstance(exc, AgentLedgerError) and exc.retriable)


class InfraError(AgentLedgerError):
    """A local service could not be started, reached or stopped. The message says what to do."""


class PortInUseError(InfraError):
    """A port a local service needs is taken by another process."""


class ServiceUnreachableError(InfraError):
    """A configured service did not answer in time; retrying later may succeed."""

    retriable = True


class DeploymentMismatchError(InfraError):
    """The database holds another deployment (another topic prefix): not retriable."""
