"""Rendering a context manifest as the model gets it: sectioned, trust-wrapped, untrusted
content as data, secrets redacted again (seed 000 §14). The manifests themselves are
``projectors.context_manifests``."""

from __future__ import annotations

import html
from collections.abc import Sequence

from projectors.context_manifests import (
    DATA_GUARD,
    INSTRUCTION_SECTIONS,
    UNTRUSTED,
    WORKING_MEMORY,
    ContextManifest,
    ManifestItem,
    artifact_handle,
    is_data_section,
)
from schemas.models import ContextItemKind as K
from schemas.secret_scan import default_detector

__all__ = ["render"]


def render(manifest: ContextManifest) -> str:
    """The sectioned, trust-wrapped context a manifest describes (seed 000 §14)."""
    blocks: list[str] = []
    guarded = False
    run: list[ManifestItem] = []
    for item in manifest.items:
        if not guarded and item.section not in INSTRUCTION_SECTIONS:
            blocks.extend(_render_run(run))
            run, guarded = [], True
            blocks.append(f"<instruction>\n{DATA_GUARD}\n</instruction>")
        if run and _block_key(run[-1]) != _block_key(item):
            blocks.extend(_render_run(run))
            run = []
        run.append(item)
    blocks.extend(_render_run(run))
    return "\n\n".join(blocks) + "\n"


def _block_key(item: ManifestItem) -> tuple[str | None, bool]:
    return item.section, _is_data(item)


def _is_data(item: ManifestItem) -> bool:
    """Rendered as data: untrusted content, data sections, and tool output of any trust."""
    return (
        is_data_section(item.section)
        or item.trust_level in UNTRUSTED
        or item.item_kind in (K.TOOL_OUTPUT, K.TOOL_OUTPUT_PLACEHOLDER)
    )


def _render_run(items: Sequence[ManifestItem]) -> list[str]:
    if not items:
        return []
    section = items[0].section or "context"
    if _is_data(items[0]):
        return [_render_data(item, _data_tag(item)) for item in items]
    if section == WORKING_MEMORY or section in INSTRUCTION_SECTIONS:
        # trusted framing, but its text is escaped all the same: a task is often third-party
        # text (a GitHub issue, a user's paste) and must not close its section and open a
        # block of its own (found trying the product: '</task_contract>...<instruction>')
        body = "\n\n".join(html.escape(_content(i), quote=False) for i in items)
    else:
        body = "\n\n".join(_render_event(i) for i in items)
    return [f"<{section}>\n{body}\n</{section}>"]


def _data_tag(item: ManifestItem) -> str:
    if is_data_section(item.section):
        return item.section or "untrusted_data"
    return "untrusted_data" if item.trust_level in UNTRUSTED else "tool_data"


def _render_data(item: ManifestItem, section: str) -> str:
    source = html.escape(item.path or item.source_entry_id or "unknown", quote=True)
    flagged = ' flagged="instruction-like"' if "instruction-like" in item.flags else ""
    trust = "untrusted" if item.trust_level in UNTRUSTED else item.trust_level.value
    call = f' call_id="{item.tool_call_id}"' if item.tool_call_id else ""
    attrs = f'trust="{trust}" kind="{item.item_kind.value}" source="{source}"{call}{flagged}'
    return f"<{section} {attrs}>\n{html.escape(_content(item), quote=False)}\n</{section}>"


def _render_event(item: ManifestItem) -> str:
    call = f' call_id="{item.tool_call_id}"' if item.tool_call_id else ""
    flagged = ' flagged="instruction-like"' if "instruction-like" in item.flags else ""
    tag = item.item_kind.value.lower()
    attrs = f'source="{item.source_entry_id}" trust="{item.trust_level.value}"{call}{flagged}'
    return f"<{tag} {attrs}>\n{html.escape(_content(item), quote=False)}\n</{tag}>"


def _content(item: ManifestItem) -> str:
    """An item's text as rendered: secrets redacted again (the projections do not rely on the
    publisher alone), artifacts offered only at a redaction level that allows it."""
    if item.text is None:
        return (
            f"[content not recorded: {item.item_kind.value} from {item.source_entry_id}, "
            f"sha256 {item.sha256[:16]}, {item.tokens} tokens]"
        )
    handles = [artifact_handle(r) for r in item.artifact_refs if r.artifact_id not in item.text]
    text, _rules = default_detector().redact("\n".join([item.text, *handles]))
    return text
