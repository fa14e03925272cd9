"""Who may say what to a model: the rules both the working memory and the next turn apply.

- Only ``MODEL_VISIBLE`` entries reach a model context, by any path (seed 000 §8): an
  ``AUDIT_ONLY``, ``HUMAN_VISIBLE``, ``INTERNAL_ONLY`` or ``REDACTED`` entry is neither an item
  of the next turn nor a source of the working memory it carries.
- An instruction binds only at the trust its kind requires (seed 000 §5): system and developer
  instructions come from the platform, organisation policy from the platform or the
  organisation, the task and approval decisions from a user or above. Trust is never raised:
  an instruction entry below its level is data, and an untrusted "task" is not the task.
- An artifact is offered to the model (by handle) only at a redaction level that allows it.
"""

from __future__ import annotations

from schemas.models import (
    ArtifactRef,
    EntryKind,
    LedgerEntry,
    RedactionLevel,
    TrustLevel,
    Visibility,
)

T = TrustLevel

_USER_OR_ABOVE = frozenset({T.PLATFORM_TRUSTED, T.ORG_TRUSTED, T.USER_TRUSTED})
INSTRUCTION_TRUST: dict[EntryKind, frozenset[TrustLevel]] = {
    EntryKind.SYSTEM_INSTRUCTION: frozenset({T.PLATFORM_TRUSTED}),
    EntryKind.DEVELOPER_INSTRUCTION: frozenset({T.PLATFORM_TRUSTED}),
    EntryKind.ORG_POLICY: frozenset({T.PLATFORM_TRUSTED, T.ORG_TRUSTED}),
    EntryKind.USER_TASK: _USER_OR_ABOVE,
    EntryKind.APPROVAL_DECISION: _USER_OR_ABOVE,
    EntryKind.REPOSITORY_INSTRUCTION: frozenset(TrustLevel),
}
OFFERED_LEVELS = frozenset({RedactionLevel.PUBLIC, RedactionLevel.REVIEW})


def model_visible(entry: LedgerEntry) -> bool:
    """Whether the entry may reach a model context at all."""
    return entry.visibility is Visibility.MODEL_VISIBLE


def may_instruct(entry: LedgerEntry) -> bool:
    """Whether an instruction entry carries the trust its kind needs (False for other kinds)."""
    allowed = INSTRUCTION_TRUST.get(entry.kind)
    return allowed is not None and entry.trust_level in allowed


def offered(ref: ArtifactRef) -> bool:
    """Whether a model may be offered this artifact by its handle."""
    return ref.redaction_level in OFFERED_LEVELS
