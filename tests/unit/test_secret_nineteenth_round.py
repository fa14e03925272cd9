"""Issue 27, nineteenth round: what the held-out horusec and gosec samples' misses taught,
written generically (after their single measurement): a quoted literal compared with a name
that says credential when the literal comes first (``if "v" == password``, gosec's G101
samples) or by ``equals()`` in either order; the assignment rules read ``NAME == "v"`` only.
And SendGrid keys of two random segments whose second is shorter than today's 43 characters
(horusec's sample: 29 and 27), caught bare. Each shape's look-alikes are left.

Values are made up here (none is a corpus's). All 9 found shapes were missed by the rules before.
"""

from __future__ import annotations

import pytest

from schemas.secret_scan import default_detector
from tests.unit.secret_support import TakeCounter, work_doubling

TOKEN = "Qm7vRt2xKp9LwZ4nHs8dFj3c"  # 24 letters and digits, all three classes
PW = "Wint3r-Is-Coming.2031"  # a password: no token rule takes it alone
HEX = "9c1e4b7a2f0d83e56b19a4c7d2e0f3a81b6c5d94"  # 40 hex digits

FOUND = [
    # the literal first, then ==, !=, ===, !== and a credential name (Go, Python, JavaScript, PHP)
    (f'\tif "{HEX}" == password {{', HEX),
    (f'\tif "{HEX}" != password {{', HEX),
    (f"if ('{PW}' === this.apiKey) {{", PW),
    (f'if "{PW}" == self.db_password:', PW),
    (f"if ('{TOKEN}' !== $this->secret) {{", TOKEN),
    # equals() in either order (Java, Kotlin)
    (f'if ("{PW}".equals(dbPassword)) {{', PW),
    (f'if (token.equalsIgnoreCase("{TOKEN}")) {{', TOKEN),
    (f'return adminPassword2.equals("{PW}");', PW),
    # SendGrid: SG., then two random segments (the second under 30 characters)
    ("The value is SG.44b7kQ3FurdH0bSH9jPSWhE8vJ.1evu4Un0TXFIb1_6zW4YOdjT for now.", None),
]

LEFT = [
    # a member of the credential, not the credential
    f'if "{TOKEN}" == token.kind {{',
    f'if ("{TOKEN}".equals(password.getAlgorithm())) {{',
    # names that say no credential, or end in something else
    f'if "{TOKEN}" == request_id {{',
    f'if "{HEX}" == password_hash {{',
    '"refresh_token".equals(grantType)',
    # references, placeholders and words as the literal
    'if "${DB_PASSWORD}" == password {',
    'if "changeme-please" == password {',
    'if ("authorization_code".equals(tokenType)) {',
    'if "application/json" == token {',
    # short literals (a flag, not a secret)
    'if "bearer" == auth {',
    # SendGrid-like names in code, no random segment
    "SG.SecurityGroupIngressRule.FromPortDefinitionName",
    "SG.SecurityGroup2Ingress.FromPortDefinitionName1.Value",
]


@pytest.mark.parametrize(("text", "secret"), FOUND)
def test_a_compared_credential_is_redacted(text: str, secret: str | None) -> None:
    redacted, _ = default_detector().redact(text)
    if secret is None:  # the token itself: SG. and its two segments
        secret = next(w for w in text.split() if w.startswith("SG."))
    assert secret not in redacted, redacted


NEW_RULES = {"credential-comparison-literal", "sendgrid-key-segments"}


@pytest.mark.parametrize("text", LEFT)
def test_look_alikes_are_left(text: str) -> None:
    """The round's rules take none of these (a random token alone may still be found by the
    keyword-less token rules, as before this round; that is not this round's question)."""
    assert not {f.rule for f in default_detector().find(text)} & NEW_RULES, text


def test_only_the_literal_is_replaced() -> None:
    redacted, rules = default_detector().redact(f'\tif "{HEX}" == password {{')
    assert redacted == '\tif "[REDACTED:credential-comparison-literal]" == password {', rules


def test_chains_of_comparisons_are_found_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 characters of comparisons on one line: every literal found, each match taken a
    bounded number of times (counted, not timed), twice the text twice the takes."""
    detector = default_detector()
    taken = TakeCounter(monkeypatch)
    unit = f'"{TOKEN}" == password && '
    copies, counts = work_doubling(detector, unit, 100_000, lambda: taken.count)
    assert counts[0] <= 6 * copies and counts[1] <= 2 * counts[0] + 10, counts
