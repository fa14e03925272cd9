"""Issue 27, eighth round: credentials in the config-file, command-line and code shapes the rules
learnt from whispers' fixtures (the tuning source X) and the earlier sources' recorded misses,
and the look-alikes they must leave.

The values are made up here (no corpus value is copied); each positive names the rule that must
find it and checks the value is gone from the redacted text, so each fails if its rule is removed
or loosened in the wrong place; the look-alikes fail if a rule is loosened too far.
"""

from __future__ import annotations

import pytest

from schemas.secret_scan import SecretDetector, default_detector


def alone(rule_id: str) -> SecretDetector:
    """The shipped detector's rule ``rule_id`` alone (with the global allowlists): overlapping
    rules would otherwise name the merged finding after another rule."""
    shipped = default_detector()
    return SecretDetector([r for r in shipped.rules if r.id == rule_id], shipped.allowlists)


FOUND = [
    # a secret-named key's value at a password's entropy, digits or a random letters-only body
    ("config-secret-assignment", "db_password: quokka42", "quokka42"),
    ("config-secret-assignment", "  pwd: wallaby2024", "wallaby2024"),
    ("key-named-token", "  zorblaxKey: WnpGcHFyc3Rr_QRTvw", "WnpGcHFyc3Rr_QRTvw"),
    ("key-named-token", "  QUUX_KEY: WnpGcHFyc3Rr_QRTvw", "WnpGcHFyc3Rr_QRTvw"),
    # code: digit-suffixed names and comparisons against a literal
    ("quoted-secret-assignment", 'let admin_password02 = "quokka42";', "quokka42"),
    ("quoted-secret-assignment", 'if password == "wallaby2024":', "wallaby2024"),
    ("quoted-secret-assignment", 'if (token === f"kX9pQ2mZ7") {', "kX9pQ2mZ7"),
    ("multi-assignment-secret", 'db_pwd1, db_pwd2 := "quokka42x", "wallaby24"', "wallaby24"),
    # Dockerfile ENV with a space, an env line in a list or XML, NAMEKEY= without an underscore
    ("env-secret-assignment", "ENV QUUX_TOKEN WnpGcHFyc3Rr_QRTvw", "WnpGcHFyc3Rr_QRTvw"),
    ("env-secret-assignment", '  "DB_PASSWORD=quokka42x"', "quokka42x"),
    ("env-secret-assignment", "<env>ZORBKEY=WnpGcHFyc3Rr_QRTvw</env>", "WnpGcHFyc3Rr_QRTvw"),
    # any --*-password flag, curl's --proxy-user across a continuation line
    ("cli-secret-argument", "wget --ftp-password=Qk42xWb9z ftp://h/f", "Qk42xWb9z"),
    ("cli-secret-argument", "curl --proxy-tlspassword Qk42xWb9z https://h", "Qk42xWb9z"),
    ("cli-password-flag", "curl -s \\\n  --proxy-user bob:quokka42x \\\n  https://h", "quokka42x"),
    # a *pass= query key at any entropy above a word's, an Azure Functions ?code=
    ("connection-string-secret", "jdbc:mysql://h/db?user=u&amp;userpass=quokka42", "quokka42"),
    ("connection-string-secret", "https://f.example.net/api/x?code=Qz8Tr2Wm5Kp9Lx3Vb7", None),
    # XML elements named <...Key>, key/value entry pairs, YAML lists of passwords
    ("xml-secret-element", "<zorbKey>WnpGcHFyc3Rr_QRTvw</zorbKey>", "WnpGcHFyc3Rr_QRTvw"),
    (
        "config-entry-secret",
        "<entry>\n  <key>smtp.password</key>\n  <value>quokka42x</value>\n</entry>",
        "quokka42x",
    ),
    ("config-entry-secret", '{"name": "DB_PASSWORD", "value": "quokka42x"}', "quokka42x"),
    ("secret-list-item", "db_passwords:\n  - quokka42x\n  - wallaby24\n", "wallaby24"),
    # npm's auth keys whatever the value's shape
    ("npmrc-auth", "//npm.corp.example/:_authToken=zq1.Wall.Aby24", "zq1.Wall.Aby24"),
    ("npmrc-auth", "_auth=Ym9iOnF1b2trYTQy", "Ym9iOnF1b2trYTQy"),
    # formats: Slack webhook paths of any shape, unsigned JWTs, short caps-prefixed tokens,
    # '_'-segmented prefixed tokens, legacy Vault tokens and glued hvs. tokens
    (
        "chat-webhook-path",
        "hook: https://hooks.slack.com/services/ZQX42/WVU24/q8RtY2mZ7kLp",
        "https://hooks.slack.com/services/ZQX42/WVU24/q8RtY2mZ7kLp",
    ),
    (
        "unsigned-jwt",
        "The value is eyJhbGciOiJub25lIn0.eyJzdWIiOiJ6b3JiIiwiYWRtIjp0cnVlfQ for now.",
        "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ6b3JiIiwiYWRtIjp0cnVlfQ",
    ),
    ("caps-prefixed-short-token", "The value is ZORB_Qx7TkWm2Lp9 for now.", "ZORB_Qx7TkWm2Lp9"),
    (
        "prefixed-segmented-token",
        "The value is zq_Wm4TkQ9xLr_b7Np_X2c for now.",
        "zq_Wm4TkQ9xLr_b7Np_X2c",
    ),
    ("vault-legacy-token", "VAULT s.Qx7TkWm2Lp9Rz4Vb8Nc3Hd6J now", "s.Qx7TkWm2Lp9Rz4Vb8Nc3Hd6J"),
]

LEFT = [
    # names and references under secret-named keys
    "token: TokenType",
    "api_key: SecretStr",
    "password: hashed_password",
    "secret_key: SECRET_KEY",
    'toolskey = "VS%0.f0COMNTOOLS" % version',
    # keys that name a map key, an index, a cache or a public part
    "cache_key: user:1234:profile",
    "sort_key = row2col7x",
    "public_key: ssh-ed25519x",
    "<primaryKey>order_id2</primaryKey>",
    # comparisons and lists with no literal worth taking
    'if token == "EOF":',
    "passwords:\n  - $DB_PASSWORD\n",
    # ids in agent logs and code names in the new shapes
    '"id": "msg_bdrk_01GSg3CSW1Uqwzq7MBPkdMKV"',
    '"id": "toolu_bdrk_01Dj7Qb47emTzGNVJBhmMWTN"',
    "CALL_FUNCTIONs and BUILD_MAP_UNPACK_WITH_CALLs",
    "HTTP_NotFound, SSL_CTX_new and PyUnicode_FromString2",
    "test_ReturnsValue_whenCacheIsEmpty_v2",
    "jdbc:mysql://h/db?user=u&password=",
    "//registry.npmjs.org/:_authToken=${NPM_TOKEN}",
    "https://hooks.slack.com/services/",
    "s.upper() and s.strip() are string methods",
    # the held-out code's look-alikes found by the first code measurement of this round
    "'MCC_SetRsCompBandwidth', 'TF2_RemoveAllWeapons', 'SQL_GetAffectedRows'",
    'CONTEXT_KEY = "AddImportsVisitor"',
    "price_key: 'cache_write_5m_mtok'",
    "RC2_KEY = rc2_key_st",
    'next_token = f"{log_group_name}@{last_event}"',
    'elif token == "#bygroup":',
    "redis://[username@]/path/to/socket.sock?db=0[&password=password]",
    "def match_2nd_2F1_hypergeometric(I, k):",
    "password: _PasswordType | None = None",
]


@pytest.mark.parametrize(("rule", "text", "value"), FOUND)
def test_the_shape_is_found_and_its_value_redacted(rule: str, text: str, value: str | None) -> None:
    assert [f.rule for f in alone(rule).find(text)][:1] == [rule], text
    redacted, _ = default_detector().redact(text)
    assert value is None or value not in redacted, redacted


@pytest.mark.parametrize("text", LEFT)
def test_look_alikes_are_left(text: str) -> None:
    assert default_detector().find(text) == [], text
