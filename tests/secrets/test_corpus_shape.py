"""Shape checks of the secret corpora: sizes, hygiene, and checksums recomputed independently."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import struct
from collections import Counter
from collections.abc import Callable

import pytest

from tests.secrets.corpus import Secret, hard_negatives, secrets
from tests.secrets.real_text import SAMPLES, real_texts

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
BANNED = ("example", "test", "dummy", "fake", "sample", "xxxx")


@pytest.fixture(scope="module")
def corpus() -> list[Secret]:
    return secrets()


def of(corpus: list[Secret], family: str) -> list[str]:
    values = [s.value for s in corpus if s.family == family]
    assert values, family
    return values


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(
        text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4)
    )


def test_sizes(corpus: list[Secret]) -> None:
    assert len(corpus) >= 320
    assert len({s.family for s in corpus}) >= 110
    assert len(hard_negatives()) >= 80


def test_deterministic(corpus: list[Secret]) -> None:
    assert secrets() == corpus
    assert hard_negatives() == hard_negatives()


def test_values_in_text_unique_and_clean(corpus: list[Secret]) -> None:
    for s in corpus:
        assert s.value and s.value in s.text, s.family
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", s.family), s.family
        low = s.value.lower()
        assert not any(word in low for word in BANNED), (s.family, s.value)
    dupes = [v for v, n in Counter(s.value for s in corpus).items() if n > 1]
    assert not dupes


def test_every_family_has_a_context_and_prefixed_ones_a_bare_use(corpus: list[Secret]) -> None:
    families = {s.family for s in corpus}
    in_context = {s.family for s in corpus if s.text != s.value}
    assert families == in_context
    bare = {s.family for s in corpus if s.text == s.value or len(s.text) < len(s.value) + 110}
    for family in (
        "github-pat-classic",
        "huggingface-token",
        "shopify-access-token",
        "pypi-upload-token",
        "telegram-bot-token",
        "stripe-live-secret",
        "slack-bot-token",
        "sendgrid-api-key",
        "npm-access-token",
        "anthropic-api-key",
        "openai-project-key",
        "gitlab-pat",
        "age-secret-key",
    ):
        assert family in bare, family


def test_high_entropy_random_values_never_bare(corpus: list[Secret]) -> None:
    for family in (
        "aws-secret-access-key",
        "datadog-api-key",
        "datadog-app-key",
        "azure-storage-account-key",
        "db-password",
        "postgres-url-password",
    ):
        for s in corpus:
            if s.family == family:
                assert s.text != s.value and len(s.text) > len(s.value) + 8, family


def b62_crc(body: str) -> str:
    n = binascii.crc32(body.encode())
    out = ""
    while n:
        n, r = divmod(n, 62)
        out = BASE62[r] + out
    return out.rjust(6, "0")


@pytest.mark.parametrize(
    ("family", "prefix", "length"),
    [
        ("github-pat-classic", "ghp_", 40),
        ("github-oauth-token", "gho_", 40),
        ("github-user-to-server-token", "ghu_", 40),
        ("github-server-to-server-token", "ghs_", 40),
        ("github-refresh-token", "ghr_", 80),
        ("npm-access-token", "npm_", 40),
    ],
)
def test_github_style_crc32_checksum(
    corpus: list[Secret], family: str, prefix: str, length: int
) -> None:
    for value in of(corpus, family):
        assert value.startswith(prefix) and len(value) == length
        body = value[len(prefix) :]
        assert body.isalnum() and body.isascii()
        assert body[-6:] == b62_crc(body[:-6]), value


def test_github_fine_grained_checksum(corpus: list[Secret]) -> None:
    for value in of(corpus, "github-fine-grained-pat"):
        head, tail = value.removeprefix("github_pat_").split("_")
        assert len(head) == 22 and len(tail) == 59 and len(value) == 93
        assert tail[-6:] == b62_crc(tail[:-6])


def test_grafana_service_account_checksum(corpus: list[Secret]) -> None:
    for value in of(corpus, "grafana-service-account-token"):
        key, _, check = value.rpartition("_")
        assert re.fullmatch(r"glsa_[A-Za-z0-9]{32}", key)
        assert check == struct.pack("<I", binascii.crc32(key.encode())).hex()


def test_age_bech32_checksum(corpus: list[Secret]) -> None:
    def polymod(values: list[int]) -> int:
        chk = 1
        for v in values:
            top = chk >> 25
            chk = (chk & 0x1FFFFFF) << 5 ^ v
            for i, gen in enumerate((0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)):
                if (top >> i) & 1:
                    chk ^= gen
        return chk

    for value in of(corpus, "age-secret-key"):
        key = re.search(r"AGE-SECRET-KEY-1[0-9A-Z]+", value)
        assert key and key.group() == value
        hrp, data = value.lower().rsplit("1", 1)
        assert hrp == "age-secret-key-" and len(data) == 58
        expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
        assert polymod(expanded + [BECH32.index(c) for c in data]) == 1


def test_pgp_armor_crc24(corpus: list[Secret]) -> None:
    def crc24(data: bytes) -> int:
        crc = 0xB704CE
        for byte in data:
            crc ^= byte << 16
            for _ in range(8):
                crc = (crc << 1) ^ (0x1864CFB if crc & 0x800000 else 0)
        return crc & 0xFFFFFF

    for value in of(corpus, "pgp-private-key-block"):
        lines = value.splitlines()
        assert lines[0] == "-----BEGIN PGP PRIVATE KEY BLOCK-----"
        assert lines[-1] == "-----END PGP PRIVATE KEY BLOCK-----"
        assert lines[-2].startswith("=")
        body = base64.b64decode("".join(lines[2:-2]))
        assert base64.b64decode(lines[-2][1:]) == crc24(body).to_bytes(3, "big")


def test_putty_ppk_v3_mac(corpus: list[Secret]) -> None:
    def sstr(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    for value in of(corpus, "putty-private-key"):
        fields: dict[str, str] = {}
        lines = value.splitlines()
        i = 0
        blobs: dict[str, bytes] = {}
        while i < len(lines):
            key, _, rest = lines[i].partition(": ")
            fields[key] = rest
            if key in ("Public-Lines", "Private-Lines"):
                n = int(rest)
                blobs[key] = base64.b64decode("".join(lines[i + 1 : i + 1 + n]))
                i += n
            i += 1
        data = (
            sstr(fields["PuTTY-User-Key-File-3"].encode())
            + sstr(fields["Encryption"].encode())
            + sstr(fields["Comment"].encode())
            + sstr(blobs["Public-Lines"])
            + sstr(blobs["Private-Lines"])
        )
        assert fields["Private-MAC"] == hmac.new(b"", data, hashlib.sha256).hexdigest()


def test_pypi_macaroon_structure(corpus: list[Secret]) -> None:
    for value in of(corpus, "pypi-upload-token"):
        raw = unb64(value.removeprefix("pypi-"))
        assert raw.startswith(b"\x02\x01\x08pypi.org\x02\x24")
        identifier = raw[13:49].decode()
        assert re.fullmatch(
            r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", identifier
        )
        assert raw[-34:-32] == b"\x06\x20"
        assert b"[3," in raw or b"[1,[" in raw


def test_structured_payloads_decode(corpus: list[Secret]) -> None:
    for value in of(corpus, "sentry-org-token"):
        _, payload, secret = value.split("_")
        assert json.loads(base64.b64decode(payload))["url"] == "https://sentry.io"
        assert len(unb64(secret)) == 32
    for value in of(corpus, "discord-bot-token"):
        first, stamp, mac = value.split(".")
        assert unb64(first).decode().isdigit() and len(stamp) == 6 and len(mac) == 38
    for value in of(corpus, "grafana-cloud-token"):
        assert set(json.loads(base64.b64decode(value[4:]))) == {"o", "n", "k", "m"}
    for value in of(corpus, "azure-storage-account-key"):
        assert len(value) == 88 and len(base64.b64decode(value)) == 64
    for value in of(corpus, "wireguard-private-key"):
        key = base64.b64decode(value)
        assert len(key) == 32 and key[0] & 7 == 0 and key[31] & 0xC0 == 0x40
    for value in of(corpus, "aws-session-token"):
        assert base64.b64decode(value).startswith(b"!\n\torigin_ec")
    for family in ("jwt-hs256", "jwt-rs256", "supabase-service-role-key"):
        for value in of(corpus, family):
            head, payload, sig = value.split(".")
            assert json.loads(unb64(head))["typ"] == "JWT"
            claims = json.loads(unb64(payload))
            assert claims["exp"] > claims["iat"]
            assert len(unb64(sig)) in (32, 256)
    for value in of(corpus, "mapbox-secret-token"):
        assert "u" in json.loads(unb64(value.split(".")[1]))


FORMATS: dict[str, str] = {
    "aws-access-key-id": r"(AKIA|ASIA)[A-Z2-7]{16}",
    "aws-secret-access-key": r"[A-Za-z0-9/+]{40}",
    "google-api-key": r"AIza[A-Za-z0-9_-]{35}",
    "azure-ad-client-secret": r"[A-Za-z0-9_.~-]{3}8Q~[A-Za-z0-9_.~-]{34}",
    "azure-devops-pat": r"[A-Za-z0-9]{52}JQQJ99[A-Za-z0-9][A-L][A-Za-z0-9]{16}AZDO[A-Za-z0-9]{4}",
    "digitalocean-token": r"do[opr]_v1_[0-9a-f]{64}",
    "heroku-api-key": r"HRKU-AA[A-Za-z0-9_-]{58}",
    "terraform-cloud-token": r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9]{67}",
    "stripe-live-secret": r"sk_live_([A-Za-z0-9]{24}|51[A-Za-z0-9]{97})",
    "stripe-webhook-secret": r"whsec_[A-Za-z0-9]{32}",
    "square-access-token": r"EAAA[A-Za-z0-9_-]{60}",
    "shopify-access-token": r"shpat_[0-9a-f]{32}",
    "slack-bot-token": r"xoxb-\d{12}-\d{13}-[A-Za-z0-9]{24}",
    "slack-user-token": r"xoxp-\d{12}-\d{12}-\d{13}-[0-9a-f]{32}",
    "slack-app-token": r"xapp-1-A[A-Z0-9]{10}-\d{13}-[0-9a-f]{64}",
    "telegram-bot-token": r"\d{8,10}:AA[A-Za-z0-9_-]{33}",
    "sendgrid-api-key": r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",
    "twilio-api-key": r"SK[0-9a-f]{32}",
    "mailchimp-api-key": r"[0-9a-f]{32}-us\d{1,2}",
    "gitlab-pat": r"glpat-[A-Za-z0-9_-]{20}",
    "openai-project-key": r"sk-proj-[A-Za-z0-9_-]{74}T3BlbkFJ[A-Za-z0-9_-]{74}",
    "anthropic-api-key": r"sk-ant-api03-[A-Za-z0-9_-]{93}AA",
    "groq-api-key": r"gsk_[A-Za-z0-9]{52}",
    "huggingface-token": r"hf_[A-Za-z]{34}",
    "replicate-api-token": r"r8_[A-Za-z0-9]{37}",
    "openrouter-api-key": r"sk-or-v1-[0-9a-f]{64}",
    "datadog-api-key": r"[0-9a-f]{32}",
    "datadog-app-key": r"[0-9a-f]{40}",
    "newrelic-user-api-key": r"NRAK-[A-Z0-9]{27}",
    "dynatrace-api-token": r"dt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}",
    "databricks-token": r"dapi[0-9a-f]{32}(-\d)?",
    "dockerhub-pat": r"dckr_(pat|oat)_[A-Za-z0-9_-]{27}",
    "nuget-api-key": r"oy2[a-z0-9]{43}",
    "rubygems-api-key": r"rubygems_[0-9a-f]{48}",
    "atlassian-api-token": r"ATATT3xFfGF0[A-Za-z0-9_-]{171}=[0-9A-F]{8}",
    "age-secret-key": r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",
}


@pytest.mark.parametrize("family", sorted(FORMATS))
def test_documented_formats(corpus: list[Secret], family: str) -> None:
    for value in of(corpus, family):
        assert re.fullmatch(FORMATS[family], value), value


def test_private_key_blocks(corpus: list[Secret]) -> None:
    labels: dict[str, Callable[[str], bool]] = {
        "rsa-private-key": lambda v: "BEGIN RSA PRIVATE KEY" in v,
        "ec-private-key": lambda v: "BEGIN EC PRIVATE KEY" in v,
        "openssh-private-key": lambda v: (
            "BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA" in v
        ),
        "pkcs8-private-key": lambda v: "BEGIN PRIVATE KEY" in v,
        "encrypted-private-key": lambda v: "ENCRYPTED" in v,
    }
    for family, check in labels.items():
        for value in of(corpus, family):
            assert check(value) and "END " in value, family


def test_hard_negatives_are_distinct_and_hold_no_corpus_secret(corpus: list[Secret]) -> None:
    negatives = hard_negatives()
    assert len({label for label, _ in negatives}) == len(negatives)
    texts = "\n".join(text for _, text in negatives)
    assert not [s.value for s in corpus if s.value in texts]


def test_real_texts() -> None:
    items = real_texts()
    assert len(items) >= 2000
    assert all(text for _, text in items)
    sample_files = {
        p.relative_to(SAMPLES).as_posix()
        for p in SAMPLES.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    contributing = {
        label.rsplit(":", 1)[0] for label, _ in items if not label.startswith("stdlib/")
    }
    assert sample_files <= contributing
    assert any(label.startswith("stdlib/") for label, _ in items)
    assert items == real_texts()
