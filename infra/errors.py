"""Errors raised while bringing local services up or down."""

from __future__ import annotations

from schemas.errors import AgentLedgerError


class InfraError(AgentLedgerError):
    """A local service could not be started, reached or stopped. The message says what to do."""


class PortInUseError(InfraError):
    """A port a local service needs is taken by another process."""


class ServiceUnreachableError(InfraError):
    """A configured service did not answer in time; retrying later may succeed."""

    retriable = True
