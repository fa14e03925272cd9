"""Errors of the ledger contract; every AgentLedger error derives from `AgentLedgerError`."""

from __future__ import annotations


class AgentLedgerError(Exception):
    """Root of every AgentLedger error; `retriable` tells a worker to retry or to dead-letter."""

    retriable = False


class BadArgumentError(AgentLedgerError):
    """A user's argument names nothing that exists or is malformed: the CLI answers with one
    line and exit code 2."""


class NotFoundError(AgentLedgerError, LookupError):
    """What a user asked to read (a run, or the requested version of it) is not in the live
    build."""


class AmbiguousRunError(BadArgumentError):
    """A run id prefix that more than one run id starts with."""


class SchemaCatalogError(AgentLedgerError):
    """A schema file is invalid or clashes with another version; fix the .avsc before deploying."""


class CodecConfigError(AgentLedgerError):
    """The codec was configured inconsistently, e.g. Confluent output without a schema id."""


class LedgerDecodeError(AgentLedgerError):
    """Bytes are not a ledger entry this catalog can read; dead-letter them with this message."""


class LedgerValidationError(AgentLedgerError):
    """An entry breaks the contract; `field` names the offending field. Fix the publisher."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"
