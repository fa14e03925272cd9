"""Errors raised while bringing local services up or down."""

from __future__ import annotations


class InfraError(Exception):
    """A local service could not be started, reached or stopped. The message says what to do."""

    retriable = False


class PortInUseError(InfraError):
    """A port a local service needs is taken by another process."""


class ServiceUnreachableError(InfraError):
    """A configured service did not answer in time; retrying later may succeed."""

    retriable = True
