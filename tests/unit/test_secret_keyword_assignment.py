"""Issue 27, fifteenth round: the generic keyword-and-assignment rules (keyword-assignment-quoted,
keyword-assignment-bare, keyword-xml-element, keyword-yaml-block) find a literal under a
credential name in any common syntax, and leave the references, placeholders, type annotations
and code that share those names.

Values are made up here (no corpus's). Without the four rules, 13 of the 24 positives are missed
(the other 11 are also found by older, narrower rules: a second net, kept on purpose).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from schemas.secret_scan import default_detector

SYM = "kx#2+c7a!Qz9"
RANDOM = "q8Rk2LzX7mVp4TnY"

FOUND = [
    # names the older rules did not know: salt, .._pw, auth, credentials, signing/master keys
    f'salt = "{RANDOM}"',
    f"cloudant_pw='{RANDOM}'",
    f"NUGET_PW={SYM}",
    f"auth: {SYM}",
    f'credentials = "{SYM}"',
    f"signing_key: {SYM}",
    f'master_key => "{SYM}"',
    # syntaxes: R's <-, calls with the name as first argument, env maps, putenv, PowerShell
    f'api_token <- "{SYM}"',
    f"define('SECURE_AUTH_SALT', '{SYM}');",
    f'setenv("SMTP_PASS", "{SYM}", 1);',
    f'os.environ["WEBHOOK_SECRET"] = "{SYM}"',
    f'putenv("DB_PASSWORD={RANDOM}");',
    f'$env:api_key = "{SYM}"',
    f'System.setProperty("encryption_key", "{SYM}");',
    f'{{\\"session_secret\\": \\"{SYM}\\"}}',
    # CLI flags with snake-case names, Dockerfile ENV, YAML flow and block styles, XML elements
    f"app --db_password {SYM}",
    f"ENV master_key {SYM}",
    f"{{ auth_token: {SYM} }}",
    f"private_key: |\n  {RANDOM}\n",
    f"<smtp_pass>{SYM}</smtp_pass>",
    f"<NUGET_PW>{RANDOM}</NUGET_PW>",
    # values with punctuation: a call-like literal, a slash-led value with braces, a generated
    # key with spaces and many symbols (a WordPress salt)
    'secret = "RAW(kx#2+c7a)"',
    "secret: /QmvEGxEXY7BS/YNvE:zxcv.YNvEGXEXY9BS}",
    "define('NONCE_SALT', 't`8|#(9;Uq.pZ*Hm+3@D K&X%7v]b');",
]

LEFT = [
    # references and placeholders
    'password = "${DB_PASSWORD}"',
    "token: {{ secrets.GITHUB_TOKEN }}",
    'api_key = "<your-api-key>"',
    "secret = changeme",
    'password: "********"',
    'salt = "%(salt)s"',
    # code: calls, members, subscripts, comparisons, type annotations, keyword arguments
    "password = get_password(user)",
    "token = self._token",
    "token = line[start:pos]",
    "elif token == TOKEN_NAME:",
    "def sign(self, private_key: SSHCertPrivateKeyTypes) -> None:",
    "private_key: PKCS7PrivateKeyTypes,",
    "proxy_auth: tuple[bytes | str, bytes | str] | None = None,",
    "offendingToken:Token=None, ctx:ParserRuleContext=None):",
    "return BasicAuth(username=username, password=password)",
    "token = b64encode(userpass).decode()",
    'admin_password = "optional(sensitive(string))"',
    # names, paths, globs, protocol words and sentences
    "secret: /run/secrets/db_password",
    'password_file = "/etc/app/password.txt"',
    'credentials: "service-account.json"',
    '"Resource": "arn:aws:secretsmanager:*:*:secret:AmazonDataZone-*"',
    "capabilities = 'LOGINDISABLED AUTH=CRAM-MD5'",
    'ACCOUNT_ID = "AWS::Auth::AccountId"',
    'password = "Enter your password here"',
    'secret = "the secret is out, tell everyone"',
    # token counts and public keys
    'max_tokens = "4096tokens"',
    'public_key = "{SYM}"'.replace("{SYM}", SYM),
]


@pytest.mark.parametrize("text", FOUND)
def test_a_literal_under_a_credential_name_is_found_in_any_syntax(text: str) -> None:
    redacted, rules = default_detector().redact(text)
    assert rules, text
    assert SYM not in redacted and RANDOM not in redacted, redacted


@pytest.mark.parametrize("text", LEFT)
def test_references_code_and_names_under_those_names_are_left(text: str) -> None:
    assert default_detector().find(text) == [], text


def test_a_shared_allowlist_reaches_exactly_the_rules_it_names(tmp_path: Path) -> None:
    """gitleaks' top-level [[allowlists]] with targetRules: written once, used by those rules
    (the keyword rules' 40-line allowlist was copied into each of four)."""
    from schemas.secret_scan import _rules

    rules_file = tmp_path / "r.toml"
    rules_file.write_text(
        '[[rules]]\nid = "a"\nregex = "a=(\\\\w+)"\nsecretGroup = 1\n'
        '[[rules]]\nid = "b"\nregex = "b=(\\\\w+)"\nsecretGroup = 1\n'
        '[[allowlists]]\ntargetRules = ["a"]\nregexes = ["^ok"]\n'
    )
    rules, everywhere = _rules(rules_file)
    by_id = {r.id: r for r in rules}
    assert len(by_id["a"].allowlists) == 1 and by_id["b"].allowlists == () and everywhere == []
    rules_file.write_text(rules_file.read_text().replace('["a"]', '["nosuch"]'))
    with pytest.raises(ValueError, match="nosuch"):
        _rules(rules_file)


def test_the_credential_name_is_written_once_and_every_rule_that_needs_it_gets_it(
    tmp_path: Path,
) -> None:
    """The credential-name pattern the keyword rules share is one ``[names]`` entry of the rules
    file, expanded into each rule that says ``{{credential_name}}`` (it was copied into seven
    rules); a name the file does not give is refused when the rules are read, naming the rule."""
    from schemas.secret_scan import EXTRA_RULES, SecretDetector, _rules

    text = EXTRA_RULES.read_text(encoding="utf-8")
    names = tomllib.loads(text)["names"]
    assert text.count("{{credential_name}}") >= 7
    assert text.count(names["credential_name"]) == 1  # the list itself, once
    rules, _ = _rules(EXTRA_RULES)
    patterns = [r.regex.pattern for r in rules]
    assert not any("{{credential_name}}" in p for p in patterns)
    assert sum(p.count(names["credential_name"]) for p in patterns) >= 7
    sharing = [r for r in rules if names["credential_name"] in r.regex.pattern]
    alone = SecretDetector(sharing)  # the rules that use the name, without the older ones
    for line in ("db_password = 'kx#2+c7a!Qz9'", "<ApiKey>kx#2+c7a!Qz9</ApiKey>"):
        redacted, ids = alone.redact(line)
        assert "kx#2+c7a!Qz9" not in redacted and ids, line
        assert set(ids) <= {r.id for r in sharing}
    broken = tmp_path / "rules.toml"
    broken.write_text(
        "[names]\nword = '''(?:x)'''\n[[rules]]\nid = \"r1\"\nregex = '''{{wordz}}=(\\w+)'''\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="rule r1: no \\[names\\] entry 'wordz'"):
        _rules(broken)
    for misspelt in ("{{Word}}", "{{word2}}", "{{ word }}"):  # refused, not matched literally
        rule = "[[rules]]\nid = \"r1\"\nregex = '''" + misspelt + "=(\\w+)'''\n"
        broken.write_text("[names]\nword = '''(?:x)'''\n" + rule, encoding="utf-8")
        with pytest.raises(ValueError, match="rule r1: no \\[names\\] entry"):
            _rules(broken)
