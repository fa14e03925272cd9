"""Issue 27, eighteenth round: what the held-out checkov fixtures' misses taught, written
generically (after its single measurement): a name/value pair whose name says credential and
whose value sits on the next line (or a few comment lines away), in either order, in YAML, HCL,
CloudFormation tags and JSON. kubernetes-env-secret knew only YAML's '- name:' then 'value:' with
a name ending in the keyword. Each shape's look-alikes are left.

Values are made up here (none is a corpus's). 5 of the 7 found shapes were missed by the rules
before (the CloudFormation tag and the JSON name-first pair were found by config-entry-secret).
"""

from __future__ import annotations

import pytest

from schemas.secret_scan import default_detector
from tests.unit.secret_support import TakeCounter, work_doubling

TOKEN = "Qm7vRt2xKp9LwZ4nHs8dFj3c"  # 24 letters and digits, all three classes
PW = "Wint3r-Is-Coming.2031"  # a password: no token rule takes it alone
# 100 characters of base64
LONG = (
    "ElXfMNe33MW4Wta31gMIdIn76FIy21DMoND0XAqI4CowfY5H5H"
    "ri4feyVz3ABMbPKf/+NWzKuvUVmkEGLBz+ndogUT8fnbehX5qZ"
)

FOUND = [
    # YAML env entries: a numbered suffix after the keyword, and the value first
    (f"  - name: TEST_PASSWORD_4\n    value: {LONG}", LONG),
    (f"  - value: {PW}\n    name: API_TOKEN_1", PW),
    # Terraform env blocks and jsonencode, with comments between the two
    (f'  name  = "DB_PASSWORD"\n  // rotated yearly\n  value = "{PW}"', PW),
    (f'  value = "{LONG}"\n  # set by ops\n  name  = "SIGNING_KEY"', LONG),
    # CloudFormation tags
    (f'        - Key: "STRIPE_SECRET"\n          Value: "{PW}"', PW),
    # JSON objects, either order
    (f'      "name": "SMTP_PASSWORD",\n      "value": "{PW}"', PW),
    (f'      "value": "{LONG}",\n      "name": "GITHUB_TOKEN"', LONG),
]

LEFT = [
    # references and placeholders under a credential name
    "- name: DB_PASSWORD\n  valueFrom:\n    secretKeyRef:\n      name: db\n      key: password",
    "- name: DB_PASSWORD\n  value: ${DB_PASSWORD}",
    '- name: DB_PASSWORD\n  value: "{{ .Values.db.password }}"',
    "- name: DB_PASSWORD\n  value: changeme-please",
    # names that say no credential
    f"- name: LOG_LEVEL\n  value: {TOKEN}",
    f"- value: {TOKEN}\n  name: TOKENIZER_MODEL",
    '- name: MAX_TOKENS\n  value: "4096000000"',
    # code: a call or a dotted member as the value
    'value = compute_digest(x)\nname = "password"',
    'value = self.config.password_field\nname = "api_token"',
    # a pair too far apart: more than five comment lines, or code between
    'name = "DB_PASSWORD"\n' + "# c\n" * 6 + f'value = "{TOKEN}"',
    f'name = "DB_PASSWORD"\nport = 5432\nvalue = "{TOKEN}"',
]


@pytest.mark.parametrize(("text", "secret"), FOUND)
def test_a_credential_named_pair_is_redacted(text: str, secret: str) -> None:
    redacted, _ = default_detector().redact(text)
    assert secret not in redacted, redacted


NEW_RULES = {"name-value-pair-credential", "value-name-pair-credential"}


@pytest.mark.parametrize("text", LEFT)
def test_look_alikes_are_left_by_the_pair_rules(text: str) -> None:
    """The pair rules take none of these (a random token alone may still be found by the
    keyword-less token rules, as before this round; that is not this round's question)."""
    assert not {f.rule for f in default_detector().find(text)} & NEW_RULES, text


def test_only_the_value_is_replaced() -> None:
    redacted, _ = default_detector().redact(f"  - name: TEST_PASSWORD_4\n    value: {LONG}")
    assert redacted.startswith("  - name: TEST_PASSWORD_4\n    value: [REDACTED:")


def test_chains_of_pairs_are_found_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 characters of alternating value/name lines: every pair found, each match taken
    a bounded number of times (counted, not timed: speed belongs to the bench), twice the text
    twice the takes."""
    detector = default_detector()
    taken = TakeCounter(monkeypatch)
    unit = f"value: {TOKEN}\nname: DB_PASSWORD\n"
    copies, counts = work_doubling(detector, unit, 100_000, lambda: taken.count)
    # each copy is taken by a fixed number of rules (both pair rules and the token rules), once
    assert counts[0] <= 6 * copies and counts[1] <= 2 * counts[0] + 10, counts
