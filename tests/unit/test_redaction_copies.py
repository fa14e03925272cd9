"""Issue 27: the value, not the match. Once a secret is found anywhere in an entry, every copy
of that value is redacted: in every field (names, paths, metadata values, JSON texts), each copy
in a text, where a rule would not fire without the first copy's context."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from schemas.factory import json_part, sample_entry
from schemas.json_form import to_json
from schemas.models import (
    Actor,
    ActorType,
    DiffFile,
    DiffPart,
    EntryKind,
    ErrorPart,
    FileChangeStatus,
    FileClassification,
    PermissionClass,
    TextPart,
    ToolCallPart,
)
from streams.redaction import SecretInIdentifierError, _Copies, redact_entry
from tests.unit.secret_corpus import corpus

# A value no rule finds bare (a password), found once in its natural line.
PASSWORD = "Tr0ub4dor-3horse"
CONTEXT = f'DB_PASSWORD="{PASSWORD}"'


def _every_string(doc: object) -> str:
    return json.dumps(doc, ensure_ascii=False)


def test_a_value_repeated_across_fields_and_inside_json_is_redacted_everywhere() -> None:
    entry = sample_entry(
        EntryKind.TOOL_CALL_REQUEST,
        parts=(
            TextPart(text=f"{CONTEXT}\nthen again: {PASSWORD} and {PASSWORD}"),
            ToolCallPart(
                tool_call_id="c1",
                tool_name=f"login-{PASSWORD}",
                permission_class=PermissionClass.EXECUTE_PRIVILEGED,
                arguments_hash="sha256:" + "0" * 64,
                started_at=datetime(2026, 12, 2, tzinfo=UTC),
            ),
            ErrorPart(category=f"auth {PASSWORD}", message=f"bad password {PASSWORD}"),
            json_part({"args": [PASSWORD, {"nested": f"x{PASSWORD}y"}], PASSWORD: 1}),
            DiffPart(
                files=(
                    DiffFile(
                        path=f"secrets/{PASSWORD}.txt",
                        status=FileChangeStatus.ADDED,
                        lines_added=1,
                        lines_deleted=0,
                        classification=FileClassification.CONFIG,
                    ),
                )
            ),
        ),
        metadata={"note": f"pw {PASSWORD}"},
    ).model_copy(update={"actor": Actor(type=ActorType.AGENT, id=f"agent-{PASSWORD}")})
    redacted = redact_entry(entry)
    assert PASSWORD not in _every_string(to_json(redacted))
    fields = {r.field for r in redacted.redactions}
    assert {"parts[1].tool_name", "parts[2].category", "actor.id", "metadata.note"} <= fields
    assert PASSWORD not in _every_string([r.model_dump(mode="json") for r in redacted.redactions])


def test_an_identifier_holding_a_value_found_elsewhere_is_refused() -> None:
    entry = sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=CONTEXT),)).model_copy(
        update={"step_id": f"step-{PASSWORD}"}
    )
    with pytest.raises(SecretInIdentifierError) as refused:
        redact_entry(entry)
    assert refused.value.field == "step_id" and PASSWORD not in str(refused.value)
    # (the contract's format refuses both ids; redact_entry refuses them on its own too)
    keyed = sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=CONTEXT),)).model_copy(
        update={"metadata": {f"k{PASSWORD}": "v"}}
    )
    with pytest.raises(SecretInIdentifierError):
        redact_entry(keyed)


def test_a_short_match_is_not_hunted_through_the_entry() -> None:
    """A value under 6 characters would take ordinary words with it: only its match goes."""
    entry = sample_entry(
        EntryKind.USER_TASK, parts=(TextPart(text='password="abc12"\nabc12 is a branch name'),)
    )
    [part] = redact_entry(entry).parts
    assert isinstance(part, TextPart)
    assert part.text.endswith("abc12 is a branch name") or "abc12" not in part.text


@pytest.mark.parametrize(("name", "secret", "text"), corpus()[::7], ids=lambda v: str(v)[:24])
def test_every_copy_of_a_corpus_secret_goes(name: str, secret: str, text: str) -> None:
    entry = sample_entry(
        EntryKind.USER_TASK,
        parts=(TextPart(text=f"{text}\n{secret}\n{secret}"), json_part({"again": secret})),
        metadata={"copy": secret},
    )
    assert secret not in _every_string(to_json(redact_entry(entry))), name


def test_a_clean_entry_is_untouched() -> None:
    entry = sample_entry(EntryKind.USER_TASK, parts=(TextPart(text="nothing secret here"),))
    assert redact_entry(entry) is entry


@pytest.mark.parametrize(
    "line",
    [
        "raise exceptions.InvalidS3LoggingLogTypeError(msg)",
        "parameters: list[core_schema.ArgumentsV3Parameter] = []",
        "'MCC_GetSlowCompTauX20Enable', 'MCC_SelectMultiClamp700B',",
        'ROLE = "AmazonElasticMapReduceforEC2Role"',
        "COCOA = {'ASPasswordCredentialIdentity', 'NSURLCredentialStorage', 'TKTokenAuthOp'}",
        "    MIIDQTCCAimgAwIBAgITBmyfz5m/jAo54vB4ikPmljZbyjANBgkqhkiG9w0BAQsF",
    ],
)
def test_code_an_agent_reads_is_not_taken_for_secrets(line: str) -> None:
    """Identifiers and certificate lines in a tool's output stay as they are (the false
    positives the generalised rules made on installed packages' code)."""
    entry = sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=line),))
    assert redact_entry(entry) is entry


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "svc", "access_token": "hudSySEqUKKkDDCDuWlzdYoM"}',  # letters only, random
        "export VAULT_TOKEN_FOR_CI=1 # hvs.JGbZZaCkOSgsZ56uhGlTK2zyC1j2mwhy0VLp4",
    ],
)
def test_random_values_are_still_caught(text: str) -> None:
    entry = sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=text),))
    assert redact_entry(entry).redactions


def test_a_match_that_takes_its_quotes_still_finds_the_value_in_json() -> None:
    """A rule whose match includes the quotes around the value (Nosey Parker's ``np.generic.2``
    example): the copies are the value without them, and a JSON text holding it stays valid
    JSON (the raw-text fallback once took the quotes and left ``{"x": [REDACTED:…]}``)."""
    value = "951bc382db9cfee29c68634761dd6e19"
    example = f"buildConfigField 'String' , 'API_KEY' , '\"{value}\"'\tAPI_KEY\t"
    entry = sample_entry(
        EntryKind.USER_TASK,
        parts=(TextPart(text=example), json_part({"x": value, "y": [value]})),
        metadata={"copy": value},
    )
    redacted = redact_entry(entry)
    assert value not in _every_string(to_json(redacted))
    json.loads(to_json(redacted)["parts"][1]["json_text"])  # still a JSON document


def test_a_copy_spanning_json_syntax_keeps_the_document_valid() -> None:
    """Were a found value to match only across JSON syntax, the raw text is redacted and kept
    as one JSON string, so the entry is still a valid one (not refused)."""
    copies = _Copies({'s3cr3t-value", "y': "generic-api-key"})
    out = copies.json_text('{"x": "s3cr3t-value", "y": 1}', "parts[0].json_text")
    assert json.loads(out) == '{"x": "[REDACTED:generic-api-key]": 1}'
    assert copies.found == [("parts[0].json_text", "generic-api-key")]


def test_a_copy_inside_json_text_is_found_through_its_escapes() -> None:
    """A value holding a backslash and a quote is escaped in a JSON text (``\\\\``, ``\\"``):
    the copy pass reads the strings the JSON holds, so the escaped copies go too."""
    value = 'x7`D"}/vYR)T;W\\5]EBrf;_&k>qX??]G&3CF=;@vyrVB'
    text = f"oauthproviders:\n  jwtsecret: '{value}'\n"
    doc = {"command": text, "token": value, "args": [value, {"again": value}]}
    entry = sample_entry(EntryKind.APPROVAL_REQUEST, parts=(json_part(doc),))
    redacted = redact_entry(entry)
    [part] = redacted.parts
    assert value not in json.dumps(json.loads(part.json_text))  # type: ignore[union-attr]
    assert json.dumps(value)[1:-1] not in part.json_text  # type: ignore[union-attr]
