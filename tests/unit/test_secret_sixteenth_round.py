"""Issue 27, sixteenth round: what the held-out leaky-repo's misses taught, written generically
(after its single measurement): a URL's userinfo with an e-mail user and an '@' in the password,
a password piped into chpasswd or passwd --stdin, a long hex credential at low entropy (an IDE's
scrambled password), and Yandex's dictionary/translate/predictor keys bare. Each shape's
look-alikes are left.

Values are made up here (none is a corpus's).
"""

from __future__ import annotations

import pytest

from schemas.secret_scan import default_detector

PW = "Zr7!q#@41x"  # a password with '@' and '#'
# 'df' then a byte, as an IDE scrambles a password: 56 hex digits at ~2.5 bits a character
HEX_SCRAMBLED = "dff9dfd8dfdedfcbdfc9dff8dfcedfd9dffadfc5dfdddfcfdf8bdfe9"
YANDEX = "trnsl.1.1.20230105T101112Z.a1f3c5e7b9d2f4a6.0c9e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d"

FOUND = [
    # URL userinfo: an e-mail as the user, '@' and '#' in the password (a .git-credentials line)
    (f"https://dev@corp.example:{PW}@github.com", PW),
    (f"git clone https://ci-bot:{PW}@gitlab.internal/group/repo.git", PW),
    ("postgres://app:s3cr3t-Pw9@db.internal:5432/app", "s3cr3t-Pw9"),
    # passwords piped into account tools
    ("RUN echo 'root:Qw3rty_77' | chpasswd && \\", "Qw3rty_77"),
    ('echo "deploy:Tr0ub4dor&3" | sudo chpasswd', "Tr0ub4dor&3"),
    ("printf 'admin:H4ppy-Days9\\n' | /usr/sbin/chpasswd", "H4ppy-Days9"),
    ('echo "Vx8!mQ2zLp" | passwd --stdin svcuser', "Vx8!mQ2zLp"),
    ("chpasswd <<< 'ops:R0tate-Me-7'", "R0tate-Me-7"),
    # a long hex credential whose characters repeat (entropy under the 2.8 named-hex asks)
    (f'<fileTransfer host="h" port="21" password="{HEX_SCRAMBLED}" username="u">', HEX_SCRAMBLED),
    (f"ftp_password: {HEX_SCRAMBLED}", HEX_SCRAMBLED),
    # Yandex keys by their literal, bare and in a line
    (f"The value is {YANDEX} for now.", YANDEX),
    (f'yandex_api_key = "{YANDEX.replace("trnsl", "dict")}"', YANDEX.replace("trnsl", "dict")),
]

LEFT = [
    # URLs with an '@' that is no password's: a user alone, a path or query after the host
    "ssh://git@github.com:22/org/repo.git",
    "https://github.com/user@example.com:8080",
    "see https://docs.example.com/a/b?email=someone@example.com",
    "mailto:someone@example.com",
    # chpasswd and passwd with references, placeholders or prompts
    'echo "root:${ROOT_PASSWORD}" | chpasswd',
    'echo "$USER:$PASS" | chpasswd',
    "echo 'user:password' | chpasswd",
    "passwd --stdin < /run/secrets/pw",
    "man chpasswd",
    # long hex under names that say hash, id or public part; short hex at low entropy
    f'password_hash = "{HEX_SCRAMBLED}"',
    f"commit_token_id: {HEX_SCRAMBLED}",
    'password = "dfdfdfdfdfdfdfdf"',
    # Yandex-like strings that are not keys
    "dict.1.1.x",
    "version dict.1.1.2 of the parser",
]


@pytest.mark.parametrize(("text", "secret"), FOUND)
def test_the_rounds_shapes_are_redacted(text: str, secret: str) -> None:
    redacted, rules = default_detector().redact(text)
    assert rules, text
    assert secret not in redacted, redacted


@pytest.mark.parametrize("text", LEFT)
def test_their_look_alikes_are_left(text: str) -> None:
    assert default_detector().find(text) == [], text


def test_the_scrambled_value_is_below_named_hex_entropy() -> None:
    """The case the new rule is for: hex whose entropy is under named-hex-credential's 2.8."""
    from schemas.secret_scan import shannon_entropy

    assert len(HEX_SCRAMBLED) >= 40 and 2.0 < shannon_entropy(HEX_SCRAMBLED) <= 2.8
