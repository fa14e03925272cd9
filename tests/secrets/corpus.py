"""A recall corpus of secrets in their real formats, and a corpus of look-alike non-secrets.

``secrets()`` returns at least 320 ``Secret`` items over more than 110 families. Every value is
drawn from a fixed-seed ``random.Random``: it has the provider's format (prefix, length,
alphabet, separators and, where the format carries one, a checksum or an inner structure that
decodes), but it is random, so it is no real credential and no documentation example. No value
contains EXAMPLE, test, dummy, fake, sample or xxxx, so a detector's placeholder allowlist cannot
excuse a miss. Each ``text`` is a snippet of the kind a coding agent reads (``.env`` lines, shell
exports, YAML/TOML/INI/JSON config, HTTP headers, curl commands, URLs with credentials, logs,
tracebacks, code, manifests, CI files, git remotes); families whose value is recognisable on its
own also appear bare or in prose, while random high-entropy values (AWS secret keys, Datadog
keys, Azure storage keys, passwords) appear only beside their key name or in their context.

Where the formats come from (provider documentation and announcements, and the open-source code
that mints or parses them), by group:

- GitHub (``ghp_ gho_ ghu_ ghs_ ghr_ github_pat_``) and npm (``npm_``): the GitHub blog posts on
  the 2021 token formats and npm's access-token format: base62 body whose last 6 characters are
  the CRC32 of the random part, base62-encoded (0-9A-Za-z) and left-padded with ``0``.
- GitLab (``glpat- gldt- glrt- glptt-``): GitLab's token-prefix docs and merge requests; the
  ``glpat-….01.…`` routable form follows GitLab's routable-token design (its trailer is random
  here). Bitbucket/Atlassian (``ATBB``, ``ATATT3xFfGF0…=<8 hex>``): shapes seen in Atlassian
  tokens; the 8-hex trailer is computed here as CRC32, which is a guess.
- Grafana (``glsa_<32>_<8 hex>``): Grafana's ``satokengen``: CRC32 (IEEE) of ``glsa_<secret>``,
  little-endian, hex. ``glc_`` is base64 of a JSON stack descriptor; legacy keys are base64 JSON.
- PyPI (``pypi-AgEIcHlwaS5vcmc…``): a real macaroon v2 binary layout (location ``pypi.org``,
  UUID identifier, warehouse-style ``[3,"<user uuid>"]`` or project caveats, 32-byte signature),
  urlsafe base64 without padding.
- Sentry (``sntrys_``): Sentry's ``orgauthtoken_token``: base64 of the JSON payload, ``_``, and
  base64 of 32 random bytes without padding; ``sntryu_`` is 64 hex; DSNs carry a 32-hex key.
- age (``AGE-SECRET-KEY-1…``): bech32 of 32 bytes with a valid checksum, upper-cased. PGP private
  key blocks carry a valid CRC-24 armor checksum. PuTTY PPK v3 files carry a valid HMAC-SHA-256
  ``Private-MAC`` (empty key, as for unencrypted files). PEM/OpenSSH keys have the real ASN.1 or
  ``openssh-key-v1`` framing around random key material. WireGuard keys are clamped X25519
  scalars.
- Azure: storage/Cosmos keys are base64 of 64 bytes (88 characters); the newer "identifiable"
  storage key has ``+ASt`` at offset 76. Azure DevOps PATs and Azure AI keys use Microsoft's
  84-character common annotated key layout (``JQQJ99`` at 52, provider signature ``AZDO`` /
  ``ACOG`` at 76; the trailing 4-character checksum is random here). Entra client secrets are
  ``xxx8Q~`` + 34 URL-unreserved characters (their checksum is not computed). SAS tokens are
  URL-encoded base64 HMAC-SHA256 signatures.
- Cloud, payment, comms, CI, registries, LLM providers, monitoring and SaaS APIs: the prefix,
  length and alphabet each provider documents (or shows in its consoles and SDKs): AWS
  ``AKIA/ASIA`` + 16 base32 and 40-character secrets, session tokens that decode to the
  ``origin_ec`` protobuf opening, ``AIza`` + 35, ``dop_v1_`` + 64 hex, ``HRKU-AA`` + 58,
  ``hvs.``, ``<14>.atlasv1.<67>``, Stripe ``sk_live_/rk_live_/whsec_``, Square ``EAAA`` /
  ``sq0atp-`` / ``sq0csp-``, Braintree ``access_token$production$…``, Shopify ``shp??_`` + 32
  hex, Slack ``xoxb/xoxp/xapp`` and webhook URLs, Discord tokens (base64 snowflake id . time .
  HMAC), Telegram ``<bot id>:AA…``, Twilio ``AC/SK`` + 32 hex, SendGrid ``SG.<22>.<43>``,
  OpenAI ``sk-proj-…T3BlbkFJ…``, Anthropic ``sk-ant-api03-…AA``, ``gsk_``, ``hf_``, ``r8_``,
  ``pplx-``, ``xai-``, ``sk-or-v1-``, Datadog 32/40 hex, New Relic ``NRAK-/NRII-``, Dynatrace
  ``dt0c01.``, Databricks ``dapi``, Okta ``00…``, Twitter/X bearer ``AAAA…%3D…``, Facebook
  ``EAA…``, Dropbox ``sl.``, Asana, Notion, Linear, Airtable, Figma, Mapbox ``sk.eyJ…``, etc.
  Cloudflare's scannable ``cfut_`` tokens end in an 8-hex checksum whose construction is not
  public; it is a random 8 hex here.
- Generic: Django ``SECRET_KEY`` from Django's 50-character alphabet, Rails ``secret_key_base``,
  Laravel ``APP_KEY=base64:…``, ``ENCRYPTION_KEY`` base64 of 32 bytes, JWTs (HS256 signed with a
  random key, RS256 with random signature bytes), basic-auth headers, Docker ``config.json``
  auths, Kubernetes ``Secret`` data, passwords in URLs, JDBC/ADO.NET connection strings and on
  command lines.

``hard_negatives()`` returns (label, text) pairs that look secret-ish but are not secrets: hashes,
ids, digests, placeholders, environment lookups, documentation example keys, agent/LLM ids.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import random
import string
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BANNED_WORDS", "Secret", "hard_negatives", "secrets"]

SEED = 20240611
BANNED_WORDS = ("example", "test", "dummy", "fake", "sample", "xxxx", "redact", "placeholder")

DIGITS = string.digits
HEX = "0123456789abcdef"
HEXU = "0123456789ABCDEF"
LOWER = string.ascii_lowercase
UPPER = string.ascii_uppercase
B62 = DIGITS + UPPER + LOWER  # the order GitHub/npm use for their checksum digits
ALNUM = UPPER + LOWER + DIGITS
B64 = UPPER + LOWER + DIGITS + "+/"
B64URL = UPPER + LOWER + DIGITS + "-_"
B32 = UPPER + "234567"
LOWNUM = LOWER + DIGITS
UPNUM = UPPER + DIGITS
URL_UNRESERVED = ALNUM + "-._~"
DJANGO_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789!@#$%^&*(-_=+)"
PASSWORD_CHARS = ALNUM + "!#%^*-_+="


@dataclass(frozen=True)
class Secret:
    """One secret: its family slug, the exact secret string, and a snippet that contains it."""

    family: str
    value: str
    text: str


def _clean(value: str) -> bool:
    low = value.lower()
    return not any(word in low for word in BANNED_WORDS)


def b62_encode(number: int, width: int = 6) -> str:
    """Base62 (0-9A-Za-z) of ``number``, left-padded with ``0`` to ``width``."""
    out = ""
    while number:
        number, rem = divmod(number, 62)
        out = B62[rem] + out
    return out.rjust(width, "0")


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wrap(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


class _Gen:
    """Random strings from one seeded ``random.Random``, never containing a banned word."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def s(self, alphabet: str, n: int) -> str:
        while True:
            value = "".join(self.r.choice(alphabet) for _ in range(n))
            if _clean(value):
                return value

    def b(self, n: int) -> bytes:
        return self.r.randbytes(n)

    def b64(self, n: int) -> str:
        while True:
            value = _b64(self.b(n))
            if _clean(value):
                return value

    def b64u(self, n: int) -> str:
        while True:
            value = _b64u(self.b(n))
            if _clean(value):
                return value

    def hex(self, n: int) -> str:
        return self.s(HEX, n)

    def num(self, n: int) -> str:
        return self.r.choice("123456789") + self.s(DIGITS, n - 1)

    def uuid4(self) -> str:
        while True:
            value = str(uuid.UUID(bytes=self.b(16), version=4))
            if _clean(value):
                return value

    def pick(self, options: Sequence[str]) -> str:
        return options[self.r.randrange(len(options))]

    def between(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def password(self, n: int = 24, alphabet: str = PASSWORD_CHARS) -> str:
        while True:
            value = self.s(alphabet, n)
            if any(c.isdigit() for c in value) and any(c.isupper() for c in value):
                return value

    def url_password(self, n: int = 22) -> str:
        return self.password(n, ALNUM + "-_.~")

    def ts(self) -> int:
        return self.between(1_704_067_200, 1_767_225_600)

    def times(self, lifetime: int) -> dict[str, int]:
        issued = self.ts()
        return {"iat": issued, "exp": issued + lifetime}


# --------------------------------------------------------------------------- checksummed formats


def github_token(g: _Gen, prefix: str, random_len: int = 30) -> str:
    """GitHub/npm style: base62 random part + base62 CRC32 of that part (6 characters)."""
    body = g.s(B62, random_len)
    return prefix + body + b62_encode(binascii.crc32(body.encode()))


def github_fine_grained(g: _Gen) -> str:
    head = "11" + g.s(UPNUM, 20)
    body = g.s(B62, 53)
    return f"github_pat_{head}_{body}{b62_encode(binascii.crc32(body.encode()))}"


def grafana_sa_token(g: _Gen) -> str:
    key = "glsa_" + g.s(ALNUM, 32)
    crc = binascii.crc32(key.encode())
    return f"{key}_{struct.pack('<I', crc).hex()}"


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def _bech32_polymod(values: list[int]) -> int:
    gen = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
    chk = 1
    for v in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ v
        for i in range(5):
            chk ^= gen[i] if (top >> i) & 1 else 0
    return chk


def _bech32_hrp_expand(hrp: str) -> list[int]:
    return [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]


def _convertbits(data: bytes, frombits: int, tobits: int) -> list[int]:
    acc = bits = 0
    out: list[int] = []
    maxv = (1 << tobits) - 1
    for value in data:
        acc = (acc << frombits) | value
        bits += frombits
        while bits >= tobits:
            bits -= tobits
            out.append((acc >> bits) & maxv)
    if bits:
        out.append((acc << (tobits - bits)) & maxv)
    return out


def age_secret_key(g: _Gen) -> str:
    hrp = "age-secret-key-"
    while True:
        data = _convertbits(g.b(32), 8, 5)
        polymod = _bech32_polymod([*_bech32_hrp_expand(hrp), *data, 0, 0, 0, 0, 0, 0]) ^ 1
        checksum = [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]
        value = (hrp + "1" + "".join(_BECH32[d] for d in data + checksum)).upper()
        if _clean(value):
            return value


def crc24(data: bytes) -> int:
    """OpenPGP armor checksum (RFC 4880 section 6.1)."""
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def pgp_private_block(g: _Gen, name: str) -> str:
    key_body = (
        b"\x04"
        + struct.pack(">I", g.ts())
        + b"\x16\x09\x2b\x06\x01\x04\x01\xda\x47\x0f\x01"
        + b"\x01\x07\x40"
        + g.b(32)
        + b"\x00"
        + g.b(34)
    )
    packets = b"\x95" + struct.pack(">H", len(key_body)) + key_body
    uid = name.encode()
    packets += b"\xb4" + bytes([len(uid)]) + uid
    sig = g.b(140)
    packets += b"\x88" + bytes([len(sig)]) + sig
    packets += b"\x9d" + bytes([88]) + g.b(88)
    armor = _wrap(_b64(packets), 64)
    check = _b64(struct.pack(">I", crc24(packets))[1:])
    return (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
        f"{armor}\n={check}\n-----END PGP PRIVATE KEY BLOCK-----"
    )


def ppk_v3(g: _Gen, comment: str) -> str:
    """PuTTY-User-Key-File-3 (ed25519, unencrypted) with a correct Private-MAC."""
    public_blob = _ssh_string(b"ssh-ed25519") + _ssh_string(g.b(32))
    private_blob = _ssh_string(g.b(32))
    mac_data = (
        _ssh_string(b"ssh-ed25519")
        + _ssh_string(b"none")
        + _ssh_string(comment.encode())
        + _ssh_string(public_blob)
        + _ssh_string(private_blob)
    )
    mac = hmac.new(b"", mac_data, hashlib.sha256).hexdigest()
    pub_lines = _wrap(_b64(public_blob), 64).split("\n")
    priv_lines = _wrap(_b64(private_blob), 64).split("\n")
    return "\n".join(
        [
            "PuTTY-User-Key-File-3: ssh-ed25519",
            "Encryption: none",
            f"Comment: {comment}",
            f"Public-Lines: {len(pub_lines)}",
            *pub_lines,
            f"Private-Lines: {len(priv_lines)}",
            *priv_lines,
            f"Private-MAC: {mac}",
        ]
    )


def pypi_token(g: _Gen, project: str | None = None) -> str:
    def field(kind: int, data: bytes) -> bytes:
        return bytes([kind, len(data)]) + data

    body = b"\x02" + field(1, b"pypi.org") + field(2, g.uuid4().encode()) + b"\x00"
    if project is None:
        body += field(2, json.dumps([3, g.uuid4()], separators=(",", ":")).encode()) + b"\x00"
    else:
        body += field(2, json.dumps([1, [project]], separators=(",", ":")).encode()) + b"\x00"
        body += field(2, json.dumps([2, [g.uuid4()]], separators=(",", ":")).encode()) + b"\x00"
    body += b"\x00" + b"\x06\x20" + g.b(32)
    return "pypi-" + _b64u(body)


def vault_token(g: _Gen) -> str:
    if g.between(0, 1):
        return "hvs." + g.s(ALNUM, 24)
    return "hvs.CAESI" + g.s(B64URL, 86)


def stripe_live_secret(g: _Gen) -> str:
    if g.between(0, 3) == 0:
        return "sk_live_" + g.s(ALNUM, 24)
    return "sk_live_51" + g.s(ALNUM, 97)


def bitbucket_app_password(g: _Gen) -> str:
    """``ATBB`` + 24 base62 + 8 upper hex (computed as CRC32 of the rest: an unverified guess)."""
    body = "ATBB" + g.s(ALNUM, 24)
    return body + f"{binascii.crc32(body.encode()):08X}"


def atlassian_api_token(g: _Gen) -> str:
    """``ATATT3xFfGF0`` + body + ``=`` + 8 upper hex (CRC32 here: an unverified guess)."""
    body = "ATATT3xFfGF0" + g.s(B64URL, 171)
    return body + f"={binascii.crc32(body.encode()):08X}"


# --------------------------------------------------------------------------- structured formats


def _json_compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def jwt_hs256(g: _Gen, payload: dict[str, object], key: bytes | None = None) -> str:
    head = _b64u(_json_compact({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64u(_json_compact(payload).encode())
    signing = f"{head}.{body}".encode()
    sig = hmac.new(key if key is not None else g.b(32), signing, hashlib.sha256).digest()
    return f"{head}.{body}.{_b64u(sig)}"


def jwt_rs256(g: _Gen, payload: dict[str, object], kid: str | None = None) -> str:
    header: dict[str, object] = {"alg": "RS256", "typ": "JWT"}
    if kid:
        header["kid"] = kid
    head = _b64u(_json_compact(header).encode())
    body = _b64u(_json_compact(payload).encode())
    return f"{head}.{body}.{_b64u(g.b(256))}"


def aws_session_token(g: _Gen) -> str:
    raw = (
        b"!\n\torigin_ec\x10"
        + bytes([g.between(1, 250)])
        + b'\x1a\tus-east-1"G0E\x02!\x00'
        + g.b(g.between(560, 640))
    )
    return _b64(raw)


def _modulus(g: _Gen, n: int) -> bytes:
    """Random bytes whose first has its top bit set, as an RSA modulus's leading byte does."""
    data = g.b(n)
    return bytes([data[0] | 0x80]) + data[1:]


def _pem(label: str, der: bytes) -> str:
    return f"-----BEGIN {label}-----\n{_wrap(_b64(der), 64)}\n-----END {label}-----"


def rsa_pkcs1_pem(g: _Gen, bits: int = 2048) -> str:
    if bits == 4096:
        der = bytes.fromhex("3082092802010002820201 00".replace(" ", "")) + _modulus(g, 2336)
    else:
        der = bytes.fromhex("308204a4020100028201 0100".replace(" ", "")) + _modulus(g, 1180)
    return _pem("RSA PRIVATE KEY", der)


def pkcs8_rsa_pem(g: _Gen) -> str:
    head = "308204bd020100300d06092a864886f70d0101010500048204a7308204a30201000282010100"
    return _pem("PRIVATE KEY", bytes.fromhex(head) + _modulus(g, 1180))


def pkcs8_ed25519_pem(g: _Gen) -> str:
    return _pem("PRIVATE KEY", bytes.fromhex("302e020100300506032b657004220420") + g.b(32))


def ec_pem(g: _Gen) -> str:
    der = (
        bytes.fromhex("30770201010420")
        + g.b(32)
        + bytes.fromhex("a00a06082a8648ce3d030107a144034200")
        + b"\x04"
        + g.b(64)
    )
    return _pem("EC PRIVATE KEY", der)


def openssh_ed25519(g: _Gen, comment: str) -> str:
    pub = g.b(32)
    pub_blob = _ssh_string(b"ssh-ed25519") + _ssh_string(pub)
    check = g.b(4)
    section = (
        check
        + check
        + _ssh_string(b"ssh-ed25519")
        + _ssh_string(pub)
        + _ssh_string(g.b(32) + pub)
        + _ssh_string(comment.encode())
    )
    pad = 1
    while len(section) % 8:
        section += bytes([pad])
        pad += 1
    blob = (
        b"openssh-key-v1\x00"
        + _ssh_string(b"none")
        + _ssh_string(b"none")
        + _ssh_string(b"")
        + struct.pack(">I", 1)
        + _ssh_string(pub_blob)
        + _ssh_string(section)
    )
    return (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n"
        f"{_wrap(_b64(blob), 70)}\n-----END OPENSSH PRIVATE KEY-----"
    )


def openssh_rsa(g: _Gen) -> str:
    head = (
        b"openssh-key-v1\x00"
        + _ssh_string(b"none")
        + _ssh_string(b"none")
        + _ssh_string(b"")
        + struct.pack(">I", 1)
        + struct.pack(">I", 0x197)
        + _ssh_string(b"ssh-rsa")
        + _ssh_string(b"\x01\x00\x01")
    )
    blob = head + g.b(2200)
    return (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n"
        f"{_wrap(_b64(blob), 70)}\n-----END OPENSSH PRIVATE KEY-----"
    )


def encrypted_pkcs8_pem(g: _Gen) -> str:
    """PBES2 (PBKDF2-HMAC-SHA256, AES-256-CBC) framing as OpenSSL 3 writes it."""
    der = (
        bytes.fromhex("3082052d305706092a864886f70d01050d304a302906092a864886f70d01050c301c0408")
        + g.b(8)
        + bytes.fromhex("02020800300c06082a864886f70d02090500301d060960864801650304012a0410")
        + g.b(16)
        + bytes.fromhex("048204d0")
        + g.b(1232)
    )
    return _pem("ENCRYPTED PRIVATE KEY", der)


def legacy_encrypted_rsa_pem(g: _Gen) -> str:
    body = _wrap(_b64(g.b(1200)), 64)
    return (
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
        f"DEK-Info: AES-256-CBC,{g.s(HEXU, 32)}\n\n{body}\n-----END RSA PRIVATE KEY-----"
    )


def cask_key(g: _Gen, provider: str) -> str:
    """Microsoft's 84-character common annotated security key layout."""
    return (
        g.s(B62, 52)
        + "JQQJ99"
        + g.s(B62, 1)
        + g.pick("ABCDEFGHIJKL")
        + g.s(B62, 16)
        + provider
        + g.s(B62, 4)
    )


def azure_identifiable_storage_key(g: _Gen) -> str:
    return g.s(B64, 76) + "+ASt" + g.s(B64, 5) + g.pick("AQgw") + "=="


def wireguard_key(g: _Gen) -> str:
    key = bytearray(g.b(32))
    key[0] &= 248
    key[31] &= 127
    key[31] |= 64
    return _b64(bytes(key))


def discord_bot_token(g: _Gen) -> str:
    user_id = g.num(18)
    first = base64.b64encode(user_id.encode()).decode().rstrip("=")
    return f"{first}.{g.s(B64URL, 6)}.{g.s(B64URL, 38)}"


def sentry_org_token(g: _Gen, org: str) -> str:
    payload = {
        "iat": g.ts() + g.between(0, 999_999) / 1_000_000,
        "url": "https://sentry.io",
        "region_url": g.pick(["https://us.sentry.io", "https://de.sentry.io"]),
        "org": org,
    }
    secret = _b64(g.b(32)).rstrip("=")
    return f"sntrys_{_b64(json.dumps(payload, separators=(',', ':')).encode())}_{secret}"


def grafana_cloud_token(g: _Gen) -> str:
    stack = g.num(6)
    desc = {
        "o": g.num(6),
        "n": f"stack-{stack}-hm-write-{g.pick(['orbit', 'ledger', 'infra'])}",
        "k": g.s(ALNUM, 24),
        "m": {"r": g.pick(["prod-us-east-0", "prod-eu-west-2"])},
    }
    return "glc_" + _b64(_json_compact(desc).encode())


def grafana_legacy_key(g: _Gen) -> str:
    return _b64(_json_compact({"k": g.s(ALNUM, 32), "n": "deploy-bot", "id": 1}).encode())


def mapbox_secret(g: _Gen, user: str) -> str:
    head = _b64u(_json_compact({"u": user, "a": g.s(LOWNUM, 25)}).encode())
    return f"sk.{head}.{g.s(B64URL, 22)}"


def twitter_bearer(g: _Gen) -> str:
    mid = g.s(ALNUM, 28)
    enc = "".join(g.pick(["%2B", "%2F", c, c, c]) for c in mid)
    return "A" * 21 + g.s(ALNUM, 5) + "A" * 6 + enc + "%3D" + g.s(ALNUM, 50)


# --------------------------------------------------------------------------- context rendering

APPS = ["billing-svc", "ingest-worker", "orbit-api", "ledger-sync", "notify", "crm-bridge"]
IMAGES = ["ghcr.io/orbitpay/api:2.14.1", "registry.northwind.io/ledger:1.9.0", "acme/worker:latest"]
USERS = ["deploy", "svc_ledger", "app_rw", "etl", "ci-bot", "marta.k", "jdoe", "orbit"]
PROSE = [
    "use token {v} for this",
    "ok the key is {v} - please add it to the config and rerun the deploy",
    "I regenerated it: {v}. The old one should be revoked now.",
    "can you check why `{v}` gets a 401 from the API?",
    "Token for the staging bot: {v} (expires in 30 days)",
    "here you go: {v}\nput it wherever the script expects it",
]


def _camel(name: str) -> str:
    parts = name.lower().split("_")
    return parts[0] + "".join(p.title() for p in parts[1:])


@dataclass(frozen=True)
class _Spec:
    family: str
    gen: Callable[[_Gen], str]
    var: str
    ctxs: tuple[str, ...]
    svc: str = "api"
    url: str = ""
    hdr: str = "Authorization: Bearer {}"


def _render(g: _Gen, kind: str, v: str, spec: _Spec) -> str:
    var = spec.var
    key = var.lower()
    svc = spec.svc
    url = spec.url or f"https://api.{svc.replace('_', '-')}.com/v1/"
    host = url.split("/")[2]
    app = g.pick(APPS)
    header = spec.hdr.format(v)
    if kind == "bare":
        return v
    if kind == "prose":
        return g.pick(PROSE).format(v=v)
    if kind == "env":
        return g.pick(
            [
                f"# {app} settings\nNODE_ENV=production\n{var}={v}\nLOG_LEVEL=info\n",
                f"$ cat .env\nAPP_NAME={app}\nDEBUG=false\n{var}={v}\n",
                f"{var}={v}",
                f"# .env.production\nPORT=3000\nDATABASE_POOL=10\n{var}={v}\nFEATURES=billing\n",
            ]
        )
    if kind == "env-quoted":
        return f'PORT=8080\n{var}="{v}"\nSENTRY_ENVIRONMENT=production'
    if kind == "export":
        return f'$ export {var}="{v}"\n$ npm run deploy -- --env production'
    if kind == "yaml":
        return f"{svc}:\n  endpoint: {url}\n  {key}: {v}\n  timeout_seconds: 30\n  retries: 3\n"
    if kind == "json":
        return json.dumps({svc: {key: v, "region": "us-east-1", "retries": 3}}, indent=2)
    if kind == "toml":
        return f'[{svc}]\nenabled = true\n{key} = "{v}"\nbase_url = "{url}"\n'
    if kind == "ini":
        return f"[{svc}]\nhost = {host}\n{key} = {v}\nverify_ssl = true\n"
    if kind == "py":
        return (
            f"import {svc.replace('-', '_')}\n\nclient = {svc.replace('-', '_')}.Client(\n"
            f'    {key}="{v}",\n    timeout=30,\n)\n'
        )
    if kind == "py-env":
        return f'import os\n\nos.environ["{var}"] = "{v}"\nmain()\n'
    if kind == "js":
        return f"const client = new Client({{\n  {_camel(var)}: '{v}',\n  baseURL: '{url}',\n}});\n"
    if kind == "docker":
        return f"docker run --rm -e {var}={v} -p 8080:8080 {g.pick(IMAGES)}"
    if kind == "compose":
        return (
            f"services:\n  {app}:\n    image: {g.pick(IMAGES)}\n    environment:\n"
            f"      - {var}={v}\n      - LOG_LEVEL=debug\n"
        )
    if kind == "k8s":
        return (
            f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {app}\nspec:\n"
            f"  template:\n    spec:\n      containers:\n        - name: {app}\n"
            f"          image: {g.pick(IMAGES)}\n          env:\n            - name: {var}\n"
            f'              value: "{v}"\n'
        )
    if kind == "gha":
        return (
            "jobs:\n  deploy:\n    runs-on: ubuntu-latest\n    env:\n"
            f"      {var}: {v}\n    steps:\n      - uses: actions/checkout@v4\n"
            "      - run: make deploy\n"
        )
    if kind == "gitlab-ci":
        return (
            f'variables:\n  {var}: "{v}"\n\n'
            "deploy:\n  stage: deploy\n  script:\n    - ./deploy.sh\n"
        )
    if kind == "log":
        return (
            f"2024-06-11 09:32:17,554 DEBUG [{app}.config] resolved settings: "
            f"{{'{key}': '{v}', 'timeout': 30, 'verify_ssl': True}}"
        )
    if kind == "trace":
        return (
            "Traceback (most recent call last):\n"
            f'  File "/srv/{app}/main.py", line 41, in <module>\n'
            "    run(settings)\n"
            f'  File "/srv/{app}/client.py", line 88, in run\n'
            "    resp.raise_for_status()\n"
            f"requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: {url}\n"
            f"settings = Settings({key}='{v}', base_url='{url}')"
        )
    if kind == "header":
        return f"GET {url} HTTP/1.1\nHost: {host}\n{header}\nAccept: application/json\n"
    if kind == "curl":
        return f'curl -sS {url} \\\n  -H "{header}" \\\n  -H "Content-Type: application/json"'
    if kind == "terraform":
        return f'provider "{svc}" {{\n  {key} = "{v}"\n}}\n'
    if kind == "netrc":
        return f"machine {host}\n  login {g.pick(USERS)}\n  password {v}\n"
    if kind == "terminal":
        return f"$ echo ${var}\n{v}\n$ ./bin/sync --dry-run"
    if kind == "dotnet":
        return json.dumps(
            {"Logging": {"LogLevel": {"Default": "Information"}}, svc.title(): {var.title(): v}},
            indent=2,
        )
    raise ValueError(kind)


# --------------------------------------------------------------------------- table families

_ALL = ("bare", "prose")
_SPECS: list[_Spec] = [
    # cloud
    _Spec(
        "google-api-key",
        lambda g: "AIza" + g.s(B64URL, 35),
        "GOOGLE_MAPS_API_KEY",
        ("bare", "env", "js", "curl"),
        "maps",
        "https://maps.googleapis.com/maps/api/geocode/json",
        "X-Goog-Api-Key: {}",
    ),
    _Spec(
        "google-gemini-api-key",
        lambda g: "AIza" + g.s(B64URL, 35),
        "GEMINI_API_KEY",
        ("export", "py-env", "header"),
        "genai",
        "https://generativelanguage.googleapis.com/v1beta/models",
        "x-goog-api-key: {}",
    ),
    _Spec(
        "google-oauth-client-secret",
        lambda g: "GOCSPX-" + g.s(B64URL, 28),
        "GOOGLE_CLIENT_SECRET",
        ("bare", "env", "json"),
        "oauth",
    ),
    _Spec(
        "google-oauth-access-token",
        lambda g: "ya29." + g.s(B64URL, 150),
        "GOOGLE_ACCESS_TOKEN",
        ("bare", "header"),
        "gcs",
        "https://storage.googleapis.com/storage/v1/b",
    ),
    _Spec(
        "google-oauth-refresh-token",
        lambda g: "1//0" + g.s(ALNUM, 2) + g.s(B64URL, 97),
        "GOOGLE_REFRESH_TOKEN",
        ("json", "env"),
        "oauth",
    ),
    _Spec(
        "azure-ad-client-secret",
        lambda g: g.s(URL_UNRESERVED, 3) + "8Q~" + g.s(URL_UNRESERVED, 34),
        "AZURE_CLIENT_SECRET",
        ("bare", "env", "dotnet", "terraform"),
        "azuread",
    ),
    _Spec(
        "azure-devops-pat",
        lambda g: cask_key(g, "AZDO"),
        "AZURE_DEVOPS_EXT_PAT",
        ("bare", "export", "gha"),
        "devops",
        "https://dev.azure.com/northwind/_apis/projects",
    ),
    _Spec(
        "azure-devops-pat-legacy",
        lambda g: g.s("abcdefghijklmnopqrstuvwxyz234567", 52),
        "AZURE_DEVOPS_PAT",
        ("env", "netrc"),
        "devops",
        "https://dev.azure.com/northwind/_apis/projects",
    ),
    _Spec(
        "azure-ai-services-key",
        lambda g: cask_key(g, "ACOG"),
        "AZURE_OPENAI_API_KEY",
        ("bare", "env", "header"),
        "openai",
        "https://northwind-oai.openai.azure.com/openai/deployments",
        "api-key: {}",
    ),
    _Spec(
        "azure-cognitive-services-key-legacy",
        lambda g: g.hex(32),
        "AZURE_SPEECH_KEY",
        ("env", "header"),
        "speech",
        "https://eastus.api.cognitive.microsoft.com/sts/v1.0/issueToken",
        "Ocp-Apim-Subscription-Key: {}",
    ),
    _Spec(
        "ibm-cloud-api-key",
        lambda g: g.s(B64URL, 44),
        "IBMCLOUD_API_KEY",
        ("env", "json"),
        "ibmcloud",
    ),
    _Spec(
        "digitalocean-token",
        lambda g: g.pick(["dop_v1_", "doo_v1_", "dor_v1_"]) + g.hex(64),
        "DIGITALOCEAN_TOKEN",
        ("bare", "export", "terraform", "curl"),
        "digitalocean",
        "https://api.digitalocean.com/v2/droplets",
    ),
    _Spec(
        "heroku-api-key",
        lambda g: "HRKU-AA" + g.s(B64URL, 58),
        "HEROKU_API_KEY",
        ("bare", "env", "netrc"),
        "heroku",
        "https://api.heroku.com/apps",
    ),
    _Spec(
        "heroku-api-key-legacy",
        lambda g: g.uuid4(),
        "HEROKU_API_KEY",
        ("env", "gha"),
        "heroku",
        "https://api.heroku.com/apps",
    ),
    _Spec(
        "linode-token",
        lambda g: g.hex(64),
        "LINODE_TOKEN",
        ("env", "terraform"),
        "linode",
        "https://api.linode.com/v4/linode/instances",
    ),
    _Spec(
        "cloudflare-api-token",
        lambda g: g.s(B64URL, 40),
        "CLOUDFLARE_API_TOKEN",
        ("env", "curl", "gha"),
        "cloudflare",
        "https://api.cloudflare.com/client/v4/user/tokens/verify",
    ),
    _Spec(
        "cloudflare-scannable-token",
        lambda g: g.pick(["cfut_", "cfat_"]) + g.s(ALNUM, 40) + g.hex(8),
        "CLOUDFLARE_API_TOKEN",
        ("bare", "export"),
        "cloudflare",
        "https://api.cloudflare.com/client/v4/user/tokens/verify",
    ),
    _Spec(
        "cloudflare-global-api-key",
        lambda g: g.hex(37),
        "CLOUDFLARE_API_KEY",
        ("env", "curl"),
        "cloudflare",
        "https://api.cloudflare.com/client/v4/zones",
        "X-Auth-Key: {}",
    ),
    _Spec(
        "cloudflare-origin-ca-key",
        lambda g: "v1.0-" + g.hex(24) + "-" + g.hex(146),
        "CF_ORIGIN_CA_KEY",
        ("bare", "env"),
        "cloudflare",
    ),
    _Spec(
        "flyio-token",
        lambda g: "FlyV1 fm2_lJPE" + g.b64(240),
        "FLY_API_TOKEN",
        ("env-quoted", "gha"),
        "fly",
        "https://api.machines.dev/v1/apps",
        "Authorization: {}",
    ),
    _Spec(
        "flyio-personal-token",
        lambda g: "fo1_" + g.s(B64URL, 43),
        "FLY_ACCESS_TOKEN",
        ("bare", "export"),
        "fly",
    ),
    _Spec(
        "vercel-token",
        lambda g: g.s(ALNUM, 24),
        "VERCEL_TOKEN",
        ("env", "gha"),
        "vercel",
        "https://api.vercel.com/v9/projects",
    ),
    _Spec(
        "netlify-token",
        lambda g: "nfp_" + g.s(ALNUM, 36),
        "NETLIFY_AUTH_TOKEN",
        ("bare", "env", "gha"),
        "netlify",
        "https://api.netlify.com/api/v1/sites",
    ),
    _Spec(
        "doppler-token",
        lambda g: (
            g.pick(["dp.st.prd.", "dp.st.dev.", "dp.pt.", "dp.sa.", "dp.ct."]) + g.s(ALNUM, 43)
        ),
        "DOPPLER_TOKEN",
        ("bare", "export", "docker"),
        "doppler",
        "https://api.doppler.com/v3/configs/config/secrets",
    ),
    _Spec(
        "hashicorp-vault-token",
        vault_token,
        "VAULT_TOKEN",
        ("bare", "export", "header"),
        "vault",
        "https://vault.northwind.internal:8200/v1/secret/data/app",
        "X-Vault-Token: {}",
    ),
    _Spec(
        "hashicorp-vault-batch-token",
        lambda g: "hvb.AAAAAQ" + g.s(B64URL, 132),
        "VAULT_TOKEN",
        ("bare", "env"),
        "vault",
    ),
    _Spec(
        "terraform-cloud-token",
        lambda g: g.s(ALNUM, 14) + ".atlasv1." + g.s(ALNUM, 67),
        "TF_TOKEN_app_terraform_io",
        ("bare", "export", "gha"),
        "tfe",
        "https://app.terraform.io/api/v2/organizations",
    ),
    # payment
    _Spec(
        "stripe-live-secret",
        stripe_live_secret,
        "STRIPE_SECRET_KEY",
        ("bare", "prose", "env", "py", "curl"),
        "stripe",
        "https://api.stripe.com/v1/charges",
    ),
    _Spec(
        "stripe-restricted-key",
        lambda g: "rk_live_51" + g.s(ALNUM, 97),
        "STRIPE_RESTRICTED_KEY",
        ("bare", "env", "js"),
        "stripe",
        "https://api.stripe.com/v1/customers",
    ),
    _Spec(
        "stripe-webhook-secret",
        lambda g: "whsec_" + g.s(ALNUM, 32),
        "STRIPE_WEBHOOK_SECRET",
        ("bare", "env", "compose"),
        "stripe",
    ),
    _Spec(
        "square-access-token",
        lambda g: "EAAA" + g.s(B64URL, 60),
        "SQUARE_ACCESS_TOKEN",
        ("bare", "env", "curl"),
        "square",
        "https://connect.squareup.com/v2/locations",
    ),
    _Spec(
        "square-access-token-legacy",
        lambda g: "sq0atp-" + g.s(B64URL, 22),
        "SQUARE_ACCESS_TOKEN",
        ("bare", "json"),
        "square",
    ),
    _Spec(
        "square-oauth-secret",
        lambda g: "sq0csp-" + g.s(B64URL, 43),
        "SQUARE_APPLICATION_SECRET",
        ("bare", "env"),
        "square",
    ),
    _Spec(
        "braintree-access-token",
        lambda g: "access_token$production$" + g.s(LOWNUM, 16) + "$" + g.hex(32),
        "BRAINTREE_ACCESS_TOKEN",
        ("bare", "env", "py"),
        "braintree",
    ),
    _Spec(
        "adyen-api-key",
        lambda g: "AQE" + g.b64(66) + "-" + g.b64(32) + "-" + g.s(ALNUM + "+;%=", 16),
        "ADYEN_API_KEY",
        ("env-quoted", "header"),
        "adyen",
        "https://checkout-live.adyenpayments.com/checkout/v71/payments",
        "X-API-Key: {}",
    ),
    _Spec(
        "plaid-access-token",
        lambda g: "access-production-" + g.uuid4(),
        "PLAID_ACCESS_TOKEN",
        ("bare", "json"),
        "plaid",
    ),
    _Spec(
        "shopify-access-token",
        lambda g: "shpat_" + g.hex(32),
        "SHOPIFY_ACCESS_TOKEN",
        ("bare", "prose", "env", "header"),
        "shopify",
        "https://orbit-goods.myshopify.com/admin/api/2024-04/products.json",
        "X-Shopify-Access-Token: {}",
    ),
    _Spec(
        "shopify-shared-secret",
        lambda g: "shpss_" + g.hex(32),
        "SHOPIFY_API_SECRET",
        ("bare", "toml"),
        "shopify",
    ),
    _Spec(
        "shopify-custom-app-token",
        lambda g: "shpca_" + g.hex(32),
        "SHOPIFY_CUSTOM_APP_TOKEN",
        ("bare", "env"),
        "shopify",
    ),
    _Spec(
        "shopify-private-app-password",
        lambda g: "shppa_" + g.hex(32),
        "SHOPIFY_PASSWORD",
        ("bare", "yaml"),
        "shopify",
    ),
    _Spec(
        "flutterwave-secret-key",
        lambda g: "FLWSECK-" + g.hex(32) + "-X",
        "FLW_SECRET_KEY",
        ("bare", "env"),
        "flutterwave",
    ),
    _Spec(
        "paystack-secret-key",
        lambda g: "sk_live_" + g.hex(40),
        "PAYSTACK_SECRET_KEY",
        ("env", "curl"),
        "paystack",
        "https://api.paystack.co/transaction/initialize",
    ),
    _Spec(
        "shippo-live-token",
        lambda g: "shippo_live_" + g.hex(40),
        "SHIPPO_API_TOKEN",
        ("bare", "header"),
        "shippo",
        "https://api.goshippo.com/shipments/",
        "Authorization: ShippoToken {}",
    ),
    # chat / comms
    _Spec(
        "slack-bot-token",
        lambda g: f"xoxb-{g.num(12)}-{g.num(13)}-{g.s(ALNUM, 24)}",
        "SLACK_BOT_TOKEN",
        ("bare", "prose", "env", "py", "curl"),
        "slack",
        "https://slack.com/api/chat.postMessage",
    ),
    _Spec(
        "slack-user-token",
        lambda g: f"xoxp-{g.num(12)}-{g.num(12)}-{g.num(13)}-{g.hex(32)}",
        "SLACK_USER_TOKEN",
        ("bare", "env", "header"),
        "slack",
        "https://slack.com/api/users.list",
    ),
    _Spec(
        "slack-app-token",
        lambda g: f"xapp-1-A{g.s(UPNUM, 10)}-{g.num(13)}-{g.hex(64)}",
        "SLACK_APP_TOKEN",
        ("bare", "env", "yaml"),
        "slack",
    ),
    _Spec(
        "slack-config-token",
        lambda g: f"xoxe.xoxp-1-{g.s(B64URL, 150)}",
        "SLACK_CONFIG_TOKEN",
        ("bare", "export"),
        "slack",
    ),
    _Spec(
        "discord-bot-token",
        discord_bot_token,
        "DISCORD_TOKEN",
        ("bare", "env", "py", "header"),
        "discord",
        "https://discord.com/api/v10/users/@me",
        "Authorization: Bot {}",
    ),
    _Spec(
        "telegram-bot-token",
        lambda g: f"{g.num(g.between(8, 10))}:AA{g.pick('EFGH')}{g.s(B64URL, 32)}",
        "TELEGRAM_BOT_TOKEN",
        ("bare", "prose", "env", "py"),
        "telegram",
    ),
    _Spec(
        "sendgrid-api-key",
        lambda g: f"SG.{g.s(B64URL, 22)}.{g.s(B64URL, 43)}",
        "SENDGRID_API_KEY",
        ("bare", "prose", "env", "curl"),
        "sendgrid",
        "https://api.sendgrid.com/v3/mail/send",
    ),
    _Spec(
        "mailgun-api-key",
        lambda g: "key-" + g.hex(32),
        "MAILGUN_API_KEY",
        ("bare", "env", "py"),
        "mailgun",
    ),
    _Spec(
        "mailgun-api-key-v2",
        lambda g: f"{g.hex(32)}-{g.hex(8)}-{g.hex(8)}",
        "MAILGUN_API_KEY",
        ("env", "ini"),
        "mailgun",
    ),
    _Spec(
        "mailchimp-api-key",
        lambda g: f"{g.hex(32)}-us{g.between(1, 21)}",
        "MAILCHIMP_API_KEY",
        ("bare", "env", "json"),
        "mailchimp",
    ),
    _Spec(
        "postmark-server-token",
        lambda g: g.uuid4(),
        "POSTMARK_SERVER_TOKEN",
        ("env", "curl"),
        "postmark",
        "https://api.postmarkapp.com/email",
        "X-Postmark-Server-Token: {}",
    ),
    _Spec(
        "brevo-api-key",
        lambda g: f"xkeysib-{g.hex(64)}-{g.s(ALNUM, 16)}",
        "BREVO_API_KEY",
        ("bare", "env", "header"),
        "brevo",
        "https://api.brevo.com/v3/smtp/email",
        "api-key: {}",
    ),
    _Spec(
        "resend-api-key",
        lambda g: f"re_{g.s(ALNUM, 8)}_{g.s(ALNUM, 24)}",
        "RESEND_API_KEY",
        ("bare", "env", "js"),
        "resend",
        "https://api.resend.com/emails",
    ),
    _Spec(
        "intercom-access-token",
        lambda g: _b64(f"tok:{g.uuid4()}:1:0".encode()),
        "INTERCOM_ACCESS_TOKEN",
        ("env", "header"),
        "intercom",
        "https://api.intercom.io/contacts",
    ),
    _Spec(
        "zendesk-api-token",
        lambda g: g.s(ALNUM, 40),
        "ZENDESK_API_TOKEN",
        ("env", "yaml"),
        "zendesk",
    ),
    # VCS and CI
    _Spec(
        "github-pat-classic",
        lambda g: github_token(g, "ghp_"),
        "GITHUB_TOKEN",
        ("bare", "prose", "export", "gha", "curl", "terminal"),
        "github",
        "https://api.github.com/user/repos",
    ),
    _Spec(
        "github-oauth-token",
        lambda g: github_token(g, "gho_"),
        "GH_TOKEN",
        ("bare", "yaml", "header"),
        "github",
        "https://api.github.com/user",
        "Authorization: token {}",
    ),
    _Spec(
        "github-user-to-server-token",
        lambda g: github_token(g, "ghu_"),
        "GITHUB_USER_TOKEN",
        ("bare", "log"),
        "github",
    ),
    _Spec(
        "github-server-to-server-token",
        lambda g: github_token(g, "ghs_"),
        "GITHUB_APP_INSTALLATION_TOKEN",
        ("bare", "trace", "header"),
        "github",
        "https://api.github.com/repos/orbitpay/ledger/pulls",
    ),
    _Spec(
        "github-refresh-token",
        lambda g: github_token(g, "ghr_", 70),
        "GITHUB_REFRESH_TOKEN",
        ("bare", "json"),
        "github",
    ),
    _Spec(
        "github-fine-grained-pat",
        github_fine_grained,
        "GITHUB_PAT",
        ("bare", "prose", "env", "docker"),
        "github",
    ),
    _Spec(
        "gitlab-pat",
        lambda g: "glpat-" + g.s(B64URL, 20),
        "GITLAB_TOKEN",
        ("bare", "prose", "env", "curl"),
        "gitlab",
        "https://gitlab.com/api/v4/projects",
        "PRIVATE-TOKEN: {}",
    ),
    _Spec(
        "gitlab-pat-routable",
        lambda g: "glpat-" + g.s(B64URL, 27) + ".01." + g.s(LOWNUM, 9),
        "GITLAB_TOKEN",
        ("bare", "export"),
        "gitlab",
    ),
    _Spec(
        "gitlab-deploy-token",
        lambda g: "gldt-" + g.s(B64URL, 20),
        "CI_DEPLOY_PASSWORD",
        ("bare", "gitlab-ci"),
        "gitlab",
    ),
    _Spec(
        "gitlab-runner-token",
        lambda g: "glrt-" + g.s(B64URL, 20),
        "RUNNER_TOKEN",
        ("bare", "toml"),
        "runners",
    ),
    _Spec(
        "gitlab-pipeline-trigger-token",
        lambda g: "glptt-" + g.hex(40),
        "TRIGGER_TOKEN",
        ("bare", "curl"),
        "gitlab",
        "https://gitlab.com/api/v4/projects/4412/trigger/pipeline",
        "TOKEN: {}",
    ),
    _Spec(
        "bitbucket-app-password",
        bitbucket_app_password,
        "BITBUCKET_APP_PASSWORD",
        ("bare", "env", "netrc"),
        "bitbucket",
        "https://api.bitbucket.org/2.0/repositories",
    ),
    _Spec(
        "atlassian-api-token",
        atlassian_api_token,
        "JIRA_API_TOKEN",
        ("bare", "prose", "env", "py"),
        "jira",
        "https://orbitpay.atlassian.net/rest/api/3/myself",
    ),
    _Spec(
        "circleci-personal-token",
        lambda g: f"CCIPAT_{g.s(ALNUM, 22)}_{g.hex(40)}",
        "CIRCLECI_TOKEN",
        ("bare", "env", "header"),
        "circleci",
        "https://circleci.com/api/v2/me",
        "Circle-Token: {}",
    ),
    _Spec(
        "circleci-token-legacy",
        lambda g: g.hex(40),
        "CIRCLE_TOKEN",
        ("env", "curl"),
        "circleci",
        "https://circleci.com/api/v2/me",
        "Circle-Token: {}",
    ),
    _Spec(
        "travis-ci-token",
        lambda g: g.s(ALNUM, 22),
        "TRAVIS_TOKEN",
        ("env", "curl"),
        "travis",
        "https://api.travis-ci.com/repos",
        "Authorization: token {}",
    ),
    _Spec(
        "buildkite-api-token",
        lambda g: "bkua_" + g.hex(40),
        "BUILDKITE_API_TOKEN",
        ("bare", "env"),
        "buildkite",
        "https://api.buildkite.com/v2/organizations",
    ),
    _Spec(
        "sonarqube-token",
        lambda g: g.pick(["squ_", "sqp_", "sqa_"]) + g.hex(40),
        "SONAR_TOKEN",
        ("bare", "gha", "env"),
        "sonar",
    ),
    _Spec(
        "sourcegraph-token",
        lambda g: f"sgp_{g.hex(16)}_{g.hex(40)}",
        "SRC_ACCESS_TOKEN",
        ("bare", "export"),
        "sourcegraph",
    ),
    _Spec(
        "pulumi-access-token",
        lambda g: "pul-" + g.hex(40),
        "PULUMI_ACCESS_TOKEN",
        ("bare", "gha"),
        "pulumi",
    ),
    _Spec(
        "postman-api-key",
        lambda g: f"PMAK-{g.hex(24)}-{g.hex(34)}",
        "POSTMAN_API_KEY",
        ("bare", "header"),
        "postman",
        "https://api.getpostman.com/collections",
        "X-Api-Key: {}",
    ),
    _Spec(
        "snyk-token",
        lambda g: g.uuid4(),
        "SNYK_TOKEN",
        ("gha", "env"),
        "snyk",
    ),
    _Spec(
        "tailscale-auth-key",
        lambda g: f"tskey-auth-k{g.s(ALNUM, 9)}11CNTRL-{g.s(ALNUM, 33)}",
        "TS_AUTHKEY",
        ("bare", "env", "docker"),
        "tailscale",
    ),
    # package registries
    _Spec(
        "npm-access-token",
        lambda g: github_token(g, "npm_"),
        "NPM_TOKEN",
        ("bare", "prose", "gha", "env"),
        "npm",
    ),
    _Spec(
        "pypi-upload-token",
        lambda g: pypi_token(g, g.pick(["", "orbit-ledger", "northwind-sdk"]) or None),
        "TWINE_PASSWORD",
        ("bare", "prose", "export", "gha"),
        "pypi",
    ),
    _Spec(
        "rubygems-api-key",
        lambda g: "rubygems_" + g.hex(48),
        "GEM_HOST_API_KEY",
        ("bare", "env", "yaml"),
        "rubygems",
    ),
    _Spec(
        "nuget-api-key",
        lambda g: "oy2" + g.s(LOWNUM, 43),
        "NUGET_API_KEY",
        ("bare", "gha", "terminal"),
        "nuget",
    ),
    _Spec(
        "dockerhub-pat",
        lambda g: g.pick(["dckr_pat_", "dckr_oat_"]) + g.s(B64URL, 27),
        "DOCKERHUB_TOKEN",
        ("bare", "prose", "gha", "env"),
        "dockerhub",
    ),
    _Spec(
        "cratesio-token",
        lambda g: "cio" + g.s(ALNUM, 32),
        "CARGO_REGISTRY_TOKEN",
        ("bare", "gha", "export"),
        "crates",
    ),
    _Spec(
        "jfrog-reference-token",
        lambda g: _b64(f"reftkn:01:{g.ts() + 31_536_000}:{g.s(ALNUM, 27)}".encode()),
        "JFROG_ACCESS_TOKEN",
        ("env", "header"),
        "artifactory",
        "https://northwind.jfrog.io/artifactory/api/repositories",
    ),
    _Spec(
        "artifactory-api-key",
        lambda g: "AKCp8" + g.s(ALNUM, 68),
        "ARTIFACTORY_API_KEY",
        ("bare", "env", "header"),
        "artifactory",
        "https://northwind.jfrog.io/artifactory/api/storage/libs",
        "X-JFrog-Art-Api: {}",
    ),
    # LLM providers
    _Spec(
        "openai-project-key",
        lambda g: "sk-proj-" + g.s(B64URL, 74) + "T3BlbkFJ" + g.s(B64URL, 74),
        "OPENAI_API_KEY",
        ("bare", "prose", "env", "py", "curl", "export"),
        "openai",
        "https://api.openai.com/v1/chat/completions",
    ),
    _Spec(
        "openai-legacy-key",
        lambda g: "sk-" + g.s(ALNUM, 20) + "T3BlbkFJ" + g.s(ALNUM, 20),
        "OPENAI_API_KEY",
        ("bare", "env", "js"),
        "openai",
        "https://api.openai.com/v1/models",
    ),
    _Spec(
        "openai-service-account-key",
        lambda g: "sk-svcacct-" + g.s(B64URL, 74) + "T3BlbkFJ" + g.s(B64URL, 74),
        "OPENAI_API_KEY",
        ("bare", "k8s"),
        "openai",
    ),
    _Spec(
        "openai-admin-key",
        lambda g: "sk-admin-" + g.s(B64URL, 74) + "T3BlbkFJ" + g.s(B64URL, 74),
        "OPENAI_ADMIN_KEY",
        ("bare", "header"),
        "openai",
        "https://api.openai.com/v1/organization/users",
    ),
    _Spec(
        "anthropic-api-key",
        lambda g: "sk-ant-api03-" + g.s(B64URL, 93) + "AA",
        "ANTHROPIC_API_KEY",
        ("bare", "prose", "env", "py", "curl", "log"),
        "anthropic",
        "https://api.anthropic.com/v1/messages",
        "x-api-key: {}",
    ),
    _Spec(
        "anthropic-admin-key",
        lambda g: "sk-ant-admin01-" + g.s(B64URL, 93) + "AA",
        "ANTHROPIC_ADMIN_KEY",
        ("bare", "header"),
        "anthropic",
        "https://api.anthropic.com/v1/organizations/api_keys",
        "x-api-key: {}",
    ),
    _Spec(
        "anthropic-oauth-token",
        lambda g: "sk-ant-oat01-" + g.s(B64URL, 93) + "AA",
        "CLAUDE_CODE_OAUTH_TOKEN",
        ("bare", "export", "gha"),
        "anthropic",
    ),
    _Spec(
        "cohere-api-key",
        lambda g: g.s(ALNUM, 40),
        "COHERE_API_KEY",
        ("env", "py"),
        "cohere",
        "https://api.cohere.com/v2/chat",
    ),
    _Spec(
        "mistral-api-key",
        lambda g: g.s(ALNUM, 32),
        "MISTRAL_API_KEY",
        ("env", "curl"),
        "mistral",
        "https://api.mistral.ai/v1/chat/completions",
    ),
    _Spec(
        "groq-api-key",
        lambda g: "gsk_" + g.s(ALNUM, 52),
        "GROQ_API_KEY",
        ("bare", "prose", "env", "py"),
        "groq",
        "https://api.groq.com/openai/v1/chat/completions",
    ),
    _Spec(
        "huggingface-token",
        lambda g: "hf_" + g.s(UPPER + LOWER, 34),
        "HF_TOKEN",
        ("bare", "prose", "export", "py", "docker"),
        "huggingface_hub",
        "https://huggingface.co/api/whoami-v2",
    ),
    _Spec(
        "huggingface-org-token",
        lambda g: "api_org_" + g.s(UPPER + LOWER, 34),
        "HUGGINGFACE_ORG_TOKEN",
        ("bare", "env"),
        "huggingface_hub",
    ),
    _Spec(
        "replicate-api-token",
        lambda g: "r8_" + g.s(ALNUM, 37),
        "REPLICATE_API_TOKEN",
        ("bare", "env", "curl"),
        "replicate",
        "https://api.replicate.com/v1/predictions",
    ),
    _Spec(
        "perplexity-api-key",
        lambda g: "pplx-" + g.s(ALNUM, 48),
        "PERPLEXITY_API_KEY",
        ("bare", "env", "js"),
        "perplexity",
        "https://api.perplexity.ai/chat/completions",
    ),
    _Spec(
        "xai-api-key",
        lambda g: "xai-" + g.s(ALNUM, 80),
        "XAI_API_KEY",
        ("bare", "env", "curl"),
        "xai",
        "https://api.x.ai/v1/chat/completions",
    ),
    _Spec(
        "openrouter-api-key",
        lambda g: "sk-or-v1-" + g.hex(64),
        "OPENROUTER_API_KEY",
        ("bare", "prose", "env", "py"),
        "openrouter",
        "https://openrouter.ai/api/v1/chat/completions",
    ),
    _Spec(
        "together-api-key",
        lambda g: g.hex(64),
        "TOGETHER_API_KEY",
        ("env", "header"),
        "together",
        "https://api.together.xyz/v1/chat/completions",
    ),
    _Spec(
        "fireworks-api-key",
        lambda g: "fw_" + g.s(ALNUM, 24),
        "FIREWORKS_API_KEY",
        ("env", "py", "prose"),
        "fireworks",
        "https://api.fireworks.ai/inference/v1/chat/completions",
    ),
    _Spec(
        "deepseek-api-key",
        lambda g: "sk-" + g.hex(32),
        "DEEPSEEK_API_KEY",
        ("env", "curl", "yaml"),
        "deepseek",
        "https://api.deepseek.com/chat/completions",
    ),
    _Spec(
        "langsmith-api-key",
        lambda g: f"{g.pick(['lsv2_pt_', 'lsv2_sk_'])}{g.hex(32)}_{g.hex(10)}",
        "LANGSMITH_API_KEY",
        ("bare", "env"),
        "langsmith",
    ),
    _Spec(
        "pinecone-api-key",
        lambda g: f"pcsk_{g.s(ALNUM, 6)}_{g.s(ALNUM, 63)}",
        "PINECONE_API_KEY",
        ("bare", "env", "py"),
        "pinecone",
    ),
    _Spec(
        "elevenlabs-api-key",
        lambda g: "sk_" + g.hex(48),
        "ELEVENLABS_API_KEY",
        ("env", "header"),
        "elevenlabs",
        "https://api.elevenlabs.io/v1/voices",
        "xi-api-key: {}",
    ),
    _Spec(
        "voyage-api-key",
        lambda g: "pa-" + g.s(B64URL, 43),
        "VOYAGE_API_KEY",
        ("env", "py"),
        "voyageai",
    ),
    _Spec(
        "wandb-api-key",
        lambda g: g.hex(40),
        "WANDB_API_KEY",
        ("env", "netrc"),
        "wandb",
        "https://api.wandb.ai/graphql",
    ),
    # monitoring
    _Spec(
        "datadog-api-key",
        lambda g: g.hex(32),
        "DD_API_KEY",
        ("env", "compose", "curl", "k8s"),
        "datadog",
        "https://api.datadoghq.com/api/v1/validate",
        "DD-API-KEY: {}",
    ),
    _Spec(
        "datadog-app-key",
        lambda g: g.hex(40),
        "DD_APP_KEY",
        ("env", "terraform", "header"),
        "datadog",
        "https://api.datadoghq.com/api/v1/monitor",
        "DD-APPLICATION-KEY: {}",
    ),
    _Spec(
        "newrelic-user-api-key",
        lambda g: "NRAK-" + g.s(UPNUM, 27),
        "NEW_RELIC_API_KEY",
        ("bare", "env", "header"),
        "newrelic",
        "https://api.newrelic.com/graphql",
        "API-Key: {}",
    ),
    _Spec(
        "newrelic-insights-insert-key",
        lambda g: "NRII-" + g.s(B64URL, 32),
        "NEW_RELIC_INSERT_KEY",
        ("bare", "header"),
        "newrelic",
        "https://insights-collector.newrelic.com/v1/accounts/2231337/events",
        "X-Insert-Key: {}",
    ),
    _Spec(
        "newrelic-license-key",
        lambda g: g.hex(36) + "NRAL",
        "NEW_RELIC_LICENSE_KEY",
        ("env", "yaml"),
        "newrelic",
    ),
    _Spec(
        "sentry-org-token",
        lambda g: sentry_org_token(g, g.pick(["orbitpay", "northwind-labs", "ledgerly"])),
        "SENTRY_AUTH_TOKEN",
        ("bare", "env", "gha"),
        "sentry",
    ),
    _Spec(
        "sentry-user-token",
        lambda g: "sntryu_" + g.hex(64),
        "SENTRY_AUTH_TOKEN",
        ("bare", "ini"),
        "sentry",
    ),
    _Spec(
        "grafana-cloud-token",
        grafana_cloud_token,
        "GRAFANA_CLOUD_TOKEN",
        ("bare", "env"),
        "grafana",
    ),
    _Spec(
        "grafana-service-account-token",
        grafana_sa_token,
        "GRAFANA_SA_TOKEN",
        ("bare", "prose", "header"),
        "grafana",
        "https://orbitpay.grafana.net/api/dashboards/home",
    ),
    _Spec(
        "grafana-api-key-legacy",
        grafana_legacy_key,
        "GRAFANA_API_KEY",
        ("env", "header"),
        "grafana",
        "https://grafana.northwind.internal/api/search",
    ),
    _Spec(
        "honeycomb-api-key",
        lambda g: g.s(ALNUM, 22),
        "HONEYCOMB_API_KEY",
        ("env", "header"),
        "honeycomb",
        "https://api.honeycomb.io/1/events/prod",
        "X-Honeycomb-Team: {}",
    ),
    _Spec(
        "pagerduty-api-key",
        lambda g: "u+" + g.s(B64URL, 18),
        "PAGERDUTY_TOKEN",
        ("env", "header"),
        "pagerduty",
        "https://api.pagerduty.com/incidents",
        "Authorization: Token token={}",
    ),
    _Spec(
        "dynatrace-api-token",
        lambda g: f"dt0c01.{g.s(UPNUM, 24)}.{g.s(UPNUM, 64)}",
        "DT_API_TOKEN",
        ("bare", "env", "header"),
        "dynatrace",
        "https://abc12345.live.dynatrace.com/api/v2/metrics",
        "Authorization: Api-Token {}",
    ),
    _Spec(
        "splunk-hec-token",
        lambda g: g.uuid4(),
        "SPLUNK_HEC_TOKEN",
        ("env", "curl"),
        "splunk",
        "https://splunk.northwind.internal:8088/services/collector/event",
        "Authorization: Splunk {}",
    ),
    _Spec(
        "rollbar-access-token",
        lambda g: g.hex(32),
        "ROLLBAR_ACCESS_TOKEN",
        ("env", "js"),
        "rollbar",
    ),
    _Spec(
        "launchdarkly-sdk-key",
        lambda g: g.pick(["sdk-", "api-"]) + g.uuid4(),
        "LAUNCHDARKLY_SDK_KEY",
        ("bare", "env"),
        "launchdarkly",
    ),
    # data stores
    _Spec(
        "databricks-token",
        lambda g: "dapi" + g.hex(32) + g.pick(["", "-2", "-3"]),
        "DATABRICKS_TOKEN",
        ("bare", "prose", "env", "ini"),
        "databricks",
        "https://adb-5529.azuredatabricks.net/api/2.0/clusters/list",
    ),
    _Spec(
        "firebase-cloud-messaging-server-key",
        lambda g: f"AAAA{g.s(B64URL, 7)}:APA91b{g.s(B64URL, 134)}",
        "FCM_SERVER_KEY",
        ("bare", "header"),
        "fcm",
        "https://fcm.googleapis.com/fcm/send",
        "Authorization: key={}",
    ),
    _Spec(
        "planetscale-password",
        lambda g: "pscale_pw_" + g.s(B64URL, 43),
        "DATABASE_PASSWORD",
        ("bare", "env"),
        "planetscale",
    ),
    _Spec(
        "planetscale-service-token",
        lambda g: "pscale_tkn_" + g.s(B64URL, 43),
        "PLANETSCALE_SERVICE_TOKEN",
        ("bare", "gha"),
        "planetscale",
    ),
    _Spec(
        "upstash-redis-rest-token",
        lambda g: "A" + g.pick(["X", "Y", "Z"]) + g.s(ALNUM, 2) + "ASQg" + g.b64u(48),
        "UPSTASH_REDIS_REST_TOKEN",
        ("env", "js"),
        "upstash",
    ),
    _Spec(
        "mongodb-atlas-private-key",
        lambda g: g.uuid4(),
        "MONGODB_ATLAS_PRIVATE_KEY",
        ("env", "terraform"),
        "mongodbatlas",
    ),
    # SaaS / auth
    _Spec(
        "okta-api-token",
        lambda g: "00" + g.s(B64URL, 40),
        "OKTA_API_TOKEN",
        ("env", "curl"),
        "okta",
        "https://northwind.okta.com/api/v1/users",
        "Authorization: SSWS {}",
    ),
    _Spec(
        "auth0-client-secret",
        lambda g: g.s(B64URL, 64),
        "AUTH0_CLIENT_SECRET",
        ("env", "json"),
        "auth0",
    ),
    _Spec(
        "facebook-access-token",
        lambda g: "EAA" + g.s(ALNUM, 3) + "ZA" + g.s(ALNUM, 170),
        "FACEBOOK_ACCESS_TOKEN",
        ("bare", "env", "curl"),
        "facebook",
        "https://graph.facebook.com/v19.0/me/accounts",
    ),
    _Spec(
        "facebook-app-secret",
        lambda g: g.hex(32),
        "FACEBOOK_APP_SECRET",
        ("env", "py"),
        "facebook",
    ),
    _Spec(
        "linkedin-client-secret",
        lambda g: g.s(ALNUM, 16),
        "LINKEDIN_CLIENT_SECRET",
        ("env", "yaml"),
        "linkedin",
    ),
    _Spec(
        "dropbox-access-token",
        lambda g: "sl." + g.s(B64URL, 135),
        "DROPBOX_ACCESS_TOKEN",
        ("bare", "env", "curl"),
        "dropbox",
        "https://api.dropboxapi.com/2/files/list_folder",
    ),
    _Spec(
        "asana-pat",
        lambda g: g.pick([f"1/{g.num(16)}:{g.hex(32)}", f"2/{g.num(16)}/{g.num(16)}:{g.hex(32)}"]),
        "ASANA_ACCESS_TOKEN",
        ("bare", "env", "header"),
        "asana",
        "https://app.asana.com/api/1.0/users/me",
    ),
    _Spec(
        "notion-integration-token",
        lambda g: "secret_" + g.s(ALNUM, 43),
        "NOTION_TOKEN",
        ("bare", "env", "js"),
        "notion",
        "https://api.notion.com/v1/databases",
    ),
    _Spec(
        "notion-token-ntn",
        lambda g: "ntn_" + g.num(11) + g.s(ALNUM, 35),
        "NOTION_API_KEY",
        ("bare", "prose", "env"),
        "notion",
    ),
    _Spec(
        "linear-api-key",
        lambda g: "lin_api_" + g.s(ALNUM, 40),
        "LINEAR_API_KEY",
        ("bare", "prose", "env", "header"),
        "linear",
        "https://api.linear.app/graphql",
        "Authorization: {}",
    ),
    _Spec(
        "airtable-pat",
        lambda g: f"pat{g.s(ALNUM, 14)}.{g.hex(64)}",
        "AIRTABLE_API_KEY",
        ("bare", "env", "curl"),
        "airtable",
        "https://api.airtable.com/v0/meta/bases",
    ),
    _Spec(
        "figma-pat",
        lambda g: "figd_" + g.s(B64URL, 40),
        "FIGMA_TOKEN",
        ("bare", "env", "header"),
        "figma",
        "https://api.figma.com/v1/me",
        "X-Figma-Token: {}",
    ),
    _Spec(
        "contentful-management-token",
        lambda g: "CFPAT-" + g.s(B64URL, 43),
        "CONTENTFUL_MANAGEMENT_TOKEN",
        ("bare", "env"),
        "contentful",
    ),
    _Spec(
        "mapbox-secret-token",
        lambda g: mapbox_secret(g, g.pick(["orbitmaps", "northwind-geo"])),
        "MAPBOX_SECRET_TOKEN",
        ("bare", "env", "netrc"),
        "mapbox",
        "https://api.mapbox.com/downloads/v2/",
    ),
    _Spec(
        "typeform-pat",
        lambda g: "tfp_" + g.s(B64URL, 44) + "_" + g.s(B64URL, 14),
        "TYPEFORM_TOKEN",
        ("bare", "env"),
        "typeform",
    ),
    _Spec(
        "hubspot-private-app-token",
        lambda g: f"pat-{g.pick(['na1', 'eu1'])}-{g.uuid4()}",
        "HUBSPOT_ACCESS_TOKEN",
        ("bare", "env", "header"),
        "hubspot",
        "https://api.hubapi.com/crm/v3/objects/contacts",
    ),
    _Spec(
        "salesforce-access-token",
        lambda g: f"00D{g.s(ALNUM, 12)}!AQ{g.s(ALNUM + '._', 94)}",
        "SF_ACCESS_TOKEN",
        ("bare", "header"),
        "salesforce",
        "https://northwind.my.salesforce.com/services/data/v60.0/sobjects",
    ),
    _Spec(
        "twitch-client-secret",
        lambda g: g.s(LOWNUM, 30),
        "TWITCH_CLIENT_SECRET",
        ("env", "json"),
        "twitch",
    ),
    _Spec(
        "spotify-client-secret",
        lambda g: g.hex(32),
        "SPOTIFY_CLIENT_SECRET",
        ("env", "py"),
        "spotify",
    ),
    _Spec(
        "github-oauth-app-client-secret",
        lambda g: g.hex(40),
        "GITHUB_CLIENT_SECRET",
        ("env", "yaml"),
        "github-oauth",
    ),
    _Spec(
        "generic-api-key-header",
        lambda g: g.s(ALNUM, 32),
        "API_KEY",
        ("header", "curl"),
        "partner",
        "https://partner-api.ledgerly.io/v2/accounts",
        "X-Api-Key: {}",
    ),
    _Spec(
        "generic-bearer-token",
        lambda g: g.s(B64URL, 43),
        "ACCESS_TOKEN",
        ("header", "curl"),
        "internal",
        "https://internal.northwind.io/api/v1/jobs",
    ),
]


# --------------------------------------------------------------------------- custom families


def _aws(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    kid, sec = "AKIA" + g.s(B32, 16), g.s(ALNUM + "/+", 40)
    text = (
        f"[default]\naws_access_key_id = {kid}\naws_secret_access_key = {sec}\n"
        "region = us-east-1\noutput = json\n"
    )
    out += [S("aws-access-key-id", kid, text), S("aws-secret-access-key", sec, text)]
    kid, sec = "AKIA" + g.s(B32, 16), g.s(ALNUM + "/+", 40)
    text = (
        f"export AWS_ACCESS_KEY_ID={kid}\nexport AWS_SECRET_ACCESS_KEY={sec}\n"
        "export AWS_DEFAULT_REGION=eu-west-1\n$ aws s3 ls s3://orbit-backups/"
    )
    out += [S("aws-access-key-id", kid, text), S("aws-secret-access-key", sec, text)]
    kid, sec = "AKIA" + g.s(B32, 16), g.s(ALNUM + "/+", 40)
    text = (
        "import boto3\n\ns3 = boto3.client(\n    's3',\n"
        f"    aws_access_key_id='{kid}',\n    aws_secret_access_key='{sec}',\n)\n"
    )
    out += [S("aws-access-key-id", kid, text), S("aws-secret-access-key", sec, text)]
    sec = g.s(ALNUM + "/+", 40)
    out.append(
        S(
            "aws-secret-access-key",
            sec,
            f"    env:\n      AWS_REGION: us-west-2\n      AWS_SECRET_ACCESS_KEY: {sec}\n",
        )
    )
    sec = g.s(ALNUM + "/+", 40)
    out.append(
        S(
            "aws-secret-access-key",
            sec,
            "botocore.exceptions.ClientError: An error occurred (SignatureDoesNotMatch)\n"
            f"config: {{'aws_secret_access_key': '{sec}', 'region_name': 'us-east-1'}}",
        )
    )
    kid = "AKIA" + g.s(B32, 16)
    out.append(S("aws-access-key-id", kid, kid))
    kid = "AKIA" + g.s(B32, 16)
    out.append(S("aws-access-key-id", kid, f"the deploy user's key id is {kid}, in us-east-1"))
    asia, sec, tok = "ASIA" + g.s(B32, 16), g.s(ALNUM + "/+", 40), aws_session_token(g)
    text = json.dumps(
        {
            "Credentials": {
                "AccessKeyId": asia,
                "SecretAccessKey": sec,
                "SessionToken": tok,
                "Expiration": "2024-06-11T10:32:17+00:00",
            },
            "AssumedRoleUser": {
                "AssumedRoleId": "AROA" + g.s(B32, 17) + ":ci",
                "Arn": "arn:aws:sts::" + g.num(12) + ":assumed-role/deployer/ci",
            },
        },
        indent=4,
    )
    out += [
        S("aws-access-key-id", asia, text),
        S("aws-secret-access-key", sec, text),
        S("aws-session-token", tok, text),
    ]
    tok = aws_session_token(g)
    out.append(S("aws-session-token", tok, f"AWS_SESSION_TOKEN={tok}\nAWS_REGION=us-east-1\n"))
    tok = aws_session_token(g)
    out.append(S("aws-session-token", tok, f"[profile ci]\naws_session_token = {tok}\n"))
    return out


def _gcp(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    for project in ("orbit-prod-4412", "northwind-data-eu"):
        pem = pkcs8_rsa_pem(g) + "\n"
        doc = {
            "type": "service_account",
            "project_id": project,
            "private_key_id": g.hex(40),
            "private_key": pem,
            "client_email": f"deployer@{project}.iam.gserviceaccount.com",
            "client_id": g.num(21),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": "https://oauth2.googleapis.com/token",
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        }
        text = json.dumps(doc, indent=2)
        value = json.dumps(pem)[1:-1]
        out.append(S("gcp-service-account-private-key", value, text))
    pem = pkcs8_rsa_pem(g) + "\n"
    value = json.dumps(pem)[1:-1]
    text = (
        "$ kubectl get secret gcp-sa -o jsonpath='{.data.key\\.json}' | base64 -d\n"
        f'{{"type": "service_account", "private_key": "{value}", '
        '"client_email": "ci@orbit-ci.iam.gserviceaccount.com"}'
    )
    out.append(S("gcp-service-account-private-key", value, text))
    return out


def _azure(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    key = g.b64(64)
    account = g.pick(["orbitprodstore", "nwlogs01"])
    conn = (
        f"DefaultEndpointsProtocol=https;AccountName={account};AccountKey={key};"
        "EndpointSuffix=core.windows.net"
    )
    out.append(S("azure-storage-account-key", key, f'AZURE_STORAGE_CONNECTION_STRING="{conn}"'))
    key = g.b64(64)
    out.append(
        S(
            "azure-storage-account-key",
            key,
            json.dumps(
                {
                    "IsEncrypted": False,
                    "Values": {
                        "AzureWebJobsStorage": (
                            f"DefaultEndpointsProtocol=https;AccountName=nwfunc;AccountKey={key};"
                            "EndpointSuffix=core.windows.net"
                        ),
                        "FUNCTIONS_WORKER_RUNTIME": "python",
                    },
                },
                indent=2,
            ),
        )
    )
    key = g.b64(64)
    out.append(
        S(
            "azure-storage-account-key",
            key,
            f"export AZURE_STORAGE_ACCOUNT=orbitbackups\nexport AZURE_STORAGE_KEY={key}\n",
        )
    )
    key = azure_identifiable_storage_key(g)
    out.append(
        S(
            "azure-storage-account-key",
            key,
            f'az storage blob list --account-name nwarchive --account-key "{key}" -c logs',
        )
    )
    key = g.b64(64)
    out.append(
        S(
            "azure-cosmosdb-key",
            key,
            f"COSMOS_CONNECTION=AccountEndpoint=https://orbit-cosmos.documents.azure.com:443/;"
            f"AccountKey={key};",
        )
    )
    key = g.b64(64)
    out.append(
        S(
            "azure-cosmosdb-key",
            key,
            f'cosmos:\n  endpoint: https://nw.documents.azure.com\n  key: "{key}"',
        )
    )
    for _ in range(3):
        sig = _b64(g.b(32)).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
        sas = (
            f"sv=2022-11-02&ss=bfqt&srt=sco&sp=rwdlacupiytfx&se=2026-01-31T18:00:00Z"
            f"&st=2024-06-11T10:00:00Z&spr=https&sig={sig}"
        )
        text = g.pick(
            [
                f"https://orbitprodstore.blob.core.windows.net/exports/q2.csv?{sas}",
                f'AZURE_STORAGE_SAS_TOKEN="?{sas}"',
                f"azcopy copy ./dist 'https://nwcdn.blob.core.windows.net/$web?{sas}' --recursive",
            ]
        )
        out.append(S("azure-sas-token", sig, text))
    return out


def _pairs(g: _Gen) -> list[Secret]:
    """Providers whose secret travels with a (non-secret) id."""
    out: list[Secret] = []
    # Alibaba
    for _ in range(2):
        kid, sec = "LTAI" + g.s(ALNUM, 20), g.s(ALNUM, 30)
        text = g.pick(
            [
                f"ALIBABA_CLOUD_ACCESS_KEY_ID={kid}\nALIBABA_CLOUD_ACCESS_KEY_SECRET={sec}\n",
                f'[default]\naccess_key_id = "{kid}"\naccess_key_secret = "{sec}"\n',
            ]
        )
        out += [S("alibaba-access-key-id", kid, text), S("alibaba-access-key-secret", sec, text)]
    kid = "LTAI" + g.s(ALNUM, 20)
    out.append(S("alibaba-access-key-id", kid, kid))
    # Scaleway
    for _ in range(2):
        sec = g.uuid4()
        text = (
            f"SCW_ACCESS_KEY=SCW{g.s(UPNUM, 17)}\nSCW_SECRET_KEY={sec}\nSCW_DEFAULT_REGION=fr-par"
        )
        out.append(S("scaleway-secret-key", sec, text))
    # Twilio
    for _ in range(2):
        tok = g.hex(32)
        text = g.pick(
            [
                f"TWILIO_ACCOUNT_SID=AC{g.hex(32)}\nTWILIO_AUTH_TOKEN={tok}\n",
                f"client = Client('AC{g.hex(32)}', '{tok}')",
            ]
        )
        out.append(S("twilio-auth-token", tok, text))
    tok = g.hex(32)
    out.append(
        S(
            "twilio-auth-token",
            tok,
            f"curl -X POST https://api.twilio.com/2010-04-01/Accounts/AC{g.hex(32)}/Messages.json"
            f" \\\n  -u AC{g.hex(32)}:{tok} --data-urlencode 'Body=deploy finished'",
        )
    )
    for _ in range(2):
        sid, sec = "SK" + g.hex(32), g.s(ALNUM, 32)
        text = f"TWILIO_API_KEY={sid}\nTWILIO_API_SECRET={sec}\n"
        out += [S("twilio-api-key", sid, text), S("twilio-api-secret", sec, text)]
    sid = "SK" + g.hex(32)
    out.append(S("twilio-api-key", sid, f"use API key {sid} for the video service"))
    # Vonage
    for _ in range(2):
        sec = g.s(ALNUM, 16)
        text = g.pick(
            [
                f"VONAGE_API_KEY={g.hex(8)}\nVONAGE_API_SECRET={sec}\n",
                f"client = vonage.Client(key='{g.hex(8)}', secret='{sec}')",
            ]
        )
        out.append(S("vonage-api-secret", sec, text))
    # Algolia
    for _ in range(2):
        key = g.hex(32)
        text = g.pick(
            [
                f"ALGOLIA_APP_ID={g.s(UPNUM, 10)}\nALGOLIA_ADMIN_API_KEY={key}\n",
                f"const client = algoliasearch('{g.s(UPNUM, 10)}', '{key}'); // admin key",
            ]
        )
        out.append(S("algolia-admin-api-key", key, text))
    # Razorpay
    for _ in range(2):
        sec = g.s(ALNUM, 24)
        text = f"RAZORPAY_KEY_ID=rzp_live_{g.s(ALNUM, 14)}\nRAZORPAY_KEY_SECRET={sec}\n"
        out.append(S("razorpay-key-secret", sec, text))
    # Plaid
    for _ in range(2):
        sec = g.hex(30)
        text = json.dumps({"client_id": g.hex(24), "secret": sec, "env": "production"}, indent=2)
        out.append(S("plaid-secret", sec, text))
    # PayPal
    for _ in range(2):
        sec = "E" + g.s(B64URL, 79)
        text = f"PAYPAL_CLIENT_ID=A{g.s(B64URL, 79)}\nPAYPAL_CLIENT_SECRET={sec}\nPAYPAL_MODE=live"
        out.append(S("paypal-client-secret", sec, text))
    # Twitter / X
    for _ in range(2):
        bearer = twitter_bearer(g)
        text = g.pick(
            [
                f"TWITTER_BEARER_TOKEN={bearer}",
                f'curl "https://api.x.com/2/tweets/search/recent?query=orbitpay" '
                f'-H "Authorization: Bearer {bearer}"',
            ]
        )
        out.append(S("twitter-bearer-token", bearer, text))
    bearer = twitter_bearer(g)
    out.append(S("twitter-bearer-token", bearer, bearer))
    for _ in range(2):
        sec = g.s(ALNUM, 50)
        text = f"TWITTER_API_KEY={g.s(ALNUM, 25)}\nTWITTER_API_SECRET={sec}\n"
        out.append(S("twitter-api-secret", sec, text))
    # Coinbase CDP
    pem = ec_pem(g) + "\n"
    value = json.dumps(pem)[1:-1]
    text = json.dumps(
        {"name": f"organizations/{g.uuid4()}/apiKeys/{g.uuid4()}", "privateKey": pem}, indent=2
    )
    out.append(S("coinbase-cdp-api-key-secret", value, text))
    # Cloudinary
    for _ in range(2):
        sec = g.s(B64URL, 27)
        text = f"CLOUDINARY_URL=cloudinary://{g.num(15)}:{sec}@orbit-media"
        out.append(S("cloudinary-api-secret", sec, text))
    # Elastic
    for _ in range(2):
        key = _b64(f"{g.s(B64URL, 20)}:{g.s(B64URL, 22)}".encode())
        text = g.pick(
            [
                f'curl -H "Authorization: ApiKey {key}" https://nw-logs.es.us-east-1.aws.found.io/_cat/indices',
                f"ELASTIC_API_KEY={key}",
            ]
        )
        out.append(S("elasticsearch-api-key", key, text))
    # Sentry DSN
    for _ in range(2):
        key = g.hex(32)
        dsn = f"https://{key}@o{g.num(7)}.ingest.us.sentry.io/{g.num(16)}"
        text = g.pick(
            [f"SENTRY_DSN={dsn}", f'sentry_sdk.init(dsn="{dsn}", traces_sample_rate=0.2)']
        )
        out.append(S("sentry-dsn-key", key, text))
    # Jenkins
    for _ in range(2):
        tok = "11" + g.hex(32)
        text = (
            f"curl -X POST -u {g.pick(USERS)}:{tok} "
            "https://jenkins.northwind.internal/job/ledger/buildWithParameters?BRANCH=main"
        )
        out.append(S("jenkins-api-token", tok, text))
    return out


def _webhooks(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    for i in range(4):
        url = (
            f"https://hooks.slack.com/services/T{g.s(UPNUM, 10)}/B{g.s(UPNUM, 10)}/{g.s(ALNUM, 24)}"
        )
        text = [
            url,
            f"SLACK_WEBHOOK_URL={url}",
            "curl -X POST -H 'Content-type: application/json' "
            f'--data \'{{"text":"done"}}\' {url}',
            f"notify:\n  slack:\n    webhook: {url}\n",
        ][i]
        out.append(S("slack-webhook-url", url, text))
    for i in range(3):
        url = f"https://discord.com/api/webhooks/1{g.s(DIGITS, 18)}/{g.s(B64URL, 68)}"
        text = [url, f"DISCORD_WEBHOOK={url}", f'requests.post("{url}", json={{"content": msg}})'][
            i
        ]
        out.append(S("discord-webhook-url", url, text))
    for i in range(2):
        url = (
            f"https://northwind.webhook.office.com/webhookb2/{g.uuid4()}@{g.uuid4()}"
            f"/IncomingWebhook/{g.hex(32)}/{g.uuid4()}/V2{g.s(B64URL, 43)}"
        )
        text = [url, f"TEAMS_WEBHOOK_URL={url}"][i]
        out.append(S("microsoft-teams-webhook-url", url, text))
    return out


def _git_remotes(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    tok = github_token(g, "ghp_")
    out.append(
        S(
            "github-pat-classic",
            tok,
            f"$ git remote -v\norigin\thttps://{g.pick(USERS)}:{tok}@github.com/orbitpay/ledger.git"
            " (fetch)\n",
        )
    )
    tok = github_token(g, "ghs_")
    out.append(
        S(
            "github-server-to-server-token",
            tok,
            f'[remote "origin"]\n\turl = https://x-access-token:{tok}@github.com/northwind/api.git\n',
        )
    )
    tok = "glpat-" + g.s(B64URL, 20)
    out.append(
        S("gitlab-pat", tok, f"git clone https://oauth2:{tok}@gitlab.com/orbit/infra/terraform.git")
    )
    pw = bitbucket_app_password(g)
    out.append(
        S(
            "bitbucket-app-password",
            pw,
            f"git push https://marta-k:{pw}@bitbucket.org/northwind/mobile.git main",
        )
    )
    return out


def _conn_strings(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    texts: list[tuple[str, Callable[[str], str]]] = [
        (
            "postgres-url-password",
            lambda p: (
                f"DATABASE_URL=postgresql://{g.pick(USERS)}:{p}@pg-prod-2.cluster-c9xk2m"
                ".us-east-1.rds.amazonaws.com:5432/ledger?sslmode=require"
            ),
        ),
        (
            "postgres-url-password",
            lambda p: (
                'engine = create_engine(\n    "postgresql+psycopg://app_rw:'
                f'{p}@db-primary.internal:5432/orbit"\n)'
            ),
        ),
        (
            "postgres-url-password",
            lambda p: (
                "psycopg.OperationalError: connection failed: FATAL:  password authentication"
                f' failed for user "etl"\n  dsn: postgres://etl:{p}@10.0.12.7:6432/warehouse'
            ),
        ),
        (
            "mysql-url-password",
            lambda p: f"MYSQL_URL=mysql://root:{p}@mysql.orbitpay.internal:3306/shop",
        ),
        (
            "mysql-url-password",
            lambda p: (
                f"spring.datasource.url=jdbc:mysql://db:3306/app\nspring.datasource.username"
                f"=app\nspring.datasource.password={p}"
            ),
        ),
        (
            "mongodb-srv-password",
            lambda p: (
                f'MONGODB_URI="mongodb+srv://{g.pick(USERS)}:{p}@cluster0.x7k2p.mongodb.net/'
                'prod?retryWrites=true&w=majority"'
            ),
        ),
        (
            "mongodb-srv-password",
            lambda p: f"const uri = 'mongodb+srv://atlas-admin:{p}@orbit.abc12.mongodb.net/';",
        ),
        (
            "redis-url-password",
            lambda p: (
                f"REDIS_URL=rediss://default:{p}@master.orbit-cache.use1.cache.amazonaws.com:6379/0"
            ),
        ),
        (
            "redis-url-password",
            lambda p: f"celery:\n  broker_url: redis://:{p}@redis.internal:6379/1\n",
        ),
        (
            "amqp-url-password",
            lambda p: (
                f"CELERY_BROKER_URL=amqps://ledger:{p}@b-3f2a.mq.us-east-1.amazonaws.com:5671"
            ),
        ),
        (
            "amqp-url-password",
            lambda p: (
                f'conn = pika.BlockingConnection(pika.URLParameters("amqp://svc:{p}@rabbit:5672/%2F"))'
            ),
        ),
        (
            "jdbc-password",
            lambda p: (
                f"jdbc:postgresql://pg.northwind.internal:5432/billing?user=billing&password={p}"
                "&ssl=true"
            ),
        ),
        (
            "jdbc-password",
            lambda p: (
                "url: jdbc:sqlserver://sql01.northwind.local:1433;databaseName=crm;user=crm_app;"
                f"password={p};encrypt=true"
            ),
        ),
        (
            "mssql-connection-password",
            lambda p: (
                f'"ConnectionStrings": {{ "Default": "Server=tcp:orbit-sql.database.windows.net,'
                f'1433;Database=orders;User ID=orders_app;Password={p};Encrypt=True;" }}'
            ),
        ),
        (
            "mssql-connection-password",
            lambda p: f"Data Source=SQL02;Initial Catalog=Payroll;User Id=sa;Password={p};",
        ),
        (
            "snowflake-password",
            lambda p: (
                f"snowflake://loader:{p}@xy12345.us-east-1/analytics/public?warehouse=LOAD_WH"
            ),
        ),
        (
            "snowflake-password",
            lambda p: (
                f"SNOWFLAKE_ACCOUNT=xy12345.us-east-1\nSNOWFLAKE_USER=dbt\nSNOWFLAKE_PASSWORD={p}"
            ),
        ),
        (
            "http-url-credentials",
            lambda p: (
                f"pip install --index-url https://ci:{p}@pypi.northwind.internal/simple/ ledger"
            ),
        ),
        (
            "http-url-credentials",
            lambda p: f"PROXY=http://proxyuser:{p}@proxy.corp.northwind.io:3128",
        ),
        (
            "ftp-url-credentials",
            lambda p: f"lftp -e 'mirror -R dist/' ftp://uploader:{p}@ftp.orbitpay.dev/www",
        ),
    ]
    for family, make in texts:
        p = g.url_password(g.between(18, 28))
        out.append(S(family, p, make(p)))
    return out


def _emit(
    out: list[Secret], family: str, gen: Callable[[], str], *makers: Callable[[str], str]
) -> None:
    """One secret per maker: a fresh value from ``gen`` in the text ``maker(value)``."""
    for make in makers:
        value = gen()
        out.append(S(family, value, make(value)))


def _generic(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    _emit(
        out,
        "db-password",
        lambda: g.password(g.between(20, 30)),
        lambda p: f'DB_PASSWORD="{p}"\nDB_HOST=db.internal\nDB_USER=ledger',
        lambda p: f"    environment:\n      POSTGRES_USER: orbit\n      POSTGRES_PASSWORD: '{p}'\n",
        lambda p: f"[client]\nuser = backup\npassword = {p}\nhost = 10.1.4.20\n",
        lambda p: f'{{"database": {{"host": "db", "user": "api", "password": "{p}"}}}}',
        lambda p: f"MYSQL_ROOT_PASSWORD={p}",
        lambda p: f'redis:\n  host: cache.internal\n  password: "{p}"\n',
    )
    _emit(
        out,
        "cli-password-argument",
        lambda: g.password(g.between(18, 26), ALNUM + "#%^*-_+="),
        lambda p: f"$ sshpass -p '{p}' ssh ops@10.0.3.14 'sudo systemctl restart ledger'",
        lambda p: f"mysql -h db.internal -u root -p'{p}' -e 'SHOW DATABASES;'",
        lambda p: f"PGPASSWORD='{p}' psql -h pg.internal -U postgres -c '\\l'",
        lambda p: f"docker login registry.northwind.io -u ci -p '{p}'",
    )
    _emit(
        out,
        "django-secret-key",
        lambda: g.s(DJANGO_CHARS, 50),
        lambda k: f"SECRET_KEY='{k}'\nDEBUG=False\nALLOWED_HOSTS=api.orbitpay.dev",
        lambda k: f'# settings/production.py\nSECRET_KEY = "{k}"\n',
        lambda k: f"DJANGO_SECRET_KEY={k}",
    )
    _emit(
        out,
        "app-secret-key",
        lambda: g.hex(64),
        lambda k: f"FLASK_SECRET_KEY={k}",
        lambda k: f"app.config['SECRET_KEY'] = '{k}'",
    )
    _emit(
        out,
        "jwt-signing-secret",
        lambda: g.pick([g.hex(64), g.b64(48)]),
        lambda k: f"JWT_SECRET={k}",
        lambda k: f"auth:\n  jwt_secret: {k}\n  ttl: 3600\n",
        lambda k: f"const token = jwt.sign(payload, '{k}', {{ expiresIn: '1h' }});",
    )
    _emit(
        out,
        "encryption-key",
        lambda: g.b64(32),
        lambda k: f"ENCRYPTION_KEY={k}",
        lambda k: f'FERNET_KEY="{k}"',
        lambda k: f"encryption:\n  key: {k}\n  algorithm: aes-256-gcm\n",
    )
    _emit(
        out,
        "rails-secret-key-base",
        lambda: g.hex(128),
        lambda k: f"SECRET_KEY_BASE={k}",
        lambda k: f"production:\n  secret_key_base: {k}\n",
    )
    for _ in range(2):
        k = "base64:" + g.b64(32)
        out.append(S("laravel-app-key", k, f"APP_NAME=Orbit\nAPP_ENV=production\nAPP_KEY={k}\n"))
    # basic auth
    _emit(
        out,
        "basic-auth-header",
        lambda: _b64(f"{g.pick(USERS)}:{g.password(20, ALNUM)}".encode()),
        lambda b: (
            f"GET /api/v1/export HTTP/1.1\nHost: reports.northwind.io\nAuthorization: Basic {b}"
        ),
        lambda b: (
            f"curl -H 'Authorization: Basic {b}' https://nexus.orbitpay.dev/service/rest/v1/repositories"
        ),
        lambda b: f"headers = {{'Authorization': 'Basic {b}', 'Accept': 'application/json'}}",
    )
    for _ in range(2):
        b = _b64(f"{g.pick(USERS)}:{g.password(22, ALNUM)}".encode())
        text = json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": b}}}, indent=2)
        out.append(S("docker-registry-auth", b, text))
    b = _b64(f"ci:{g.password(22, ALNUM)}".encode())
    out.append(
        S("npmrc-auth", b, f"registry=https://npm.northwind.io/\n_auth={b}\nalways-auth=true")
    )
    # Kubernetes
    for _ in range(3):
        b = _b64(g.password(g.between(20, 28)).encode())
        text = (
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ledger-db\ntype: Opaque\ndata:\n"
            f"  username: {_b64(b'ledger')}\n  password: {b}\n"
        )
        out.append(S("kubernetes-secret-data", b, text))
    for _ in range(2):
        tok = jwt_rs256(
            g,
            {
                "aud": ["https://kubernetes.default.svc.cluster.local"],
                **g.times(31_536_000),
                "iss": "https://kubernetes.default.svc.cluster.local",
                "kubernetes.io": {
                    "namespace": "prod",
                    "serviceaccount": {"name": "deployer", "uid": g.uuid4()},
                },
                "sub": "system:serviceaccount:prod:deployer",
            },
            kid=g.s(B64URL, 43),
        )
        text = g.pick(
            [
                f"users:\n- name: deployer\n  user:\n    token: {tok}\n",
                f"kubectl --server https://10.0.0.1:6443 --token={tok} get pods -A",
            ]
        )
        out.append(S("kubernetes-service-account-token", tok, text))
    # JWTs
    for make in (
        lambda t: f"Authorization: Bearer {t}",
        lambda t: f"Set-Cookie: session={t}; Path=/; HttpOnly; Secure",
        lambda t: t,
    ):
        t = jwt_hs256(
            g,
            {"sub": g.uuid4(), "role": "admin", **g.times(86_400)},
        )
        out.append(S("jwt-hs256", t, make(t)))
    for make in (
        lambda t: f"curl -H 'Authorization: Bearer {t}' https://api.orbitpay.dev/v1/accounts",
        lambda t: json.dumps({"access_token": t, "token_type": "Bearer", "expires_in": 3600}),
    ):
        t = jwt_rs256(
            g,
            {
                "iss": "https://northwind.auth0.com/",
                "sub": "auth0|" + g.hex(24),
                "aud": "https://api.northwind.io",
                **g.times(86_400),
                "scope": "read:orders write:orders",
            },
            kid=g.s(B64URL, 22),
        )
        out.append(S("jwt-rs256", t, make(t)))
    for make in (
        lambda t: f"SUPABASE_SERVICE_ROLE_KEY={t}",
        lambda t: f"const supabase = createClient('https://{g.s(LOWER, 20)}.supabase.co', '{t}')",
    ):
        t = jwt_hs256(
            g,
            {
                "iss": "supabase",
                "ref": g.s(LOWER, 20),
                "role": "service_role",
                **g.times(315_360_000),
            },
        )
        out.append(S("supabase-service-role-key", t, make(t)))
    # OAuth client secrets (generic)
    _emit(
        out,
        "oauth-client-secret",
        lambda: g.s(B64URL, 40),
        lambda s: f"OAUTH_CLIENT_ID={g.hex(20)}\nOAUTH_CLIENT_SECRET={s}\n",
        lambda s: (
            f"curl -d 'grant_type=client_credentials&client_id=orbit-cli&client_secret={s}' "
            "https://id.northwind.io/oauth/token"
        ),
    )
    # age / wireguard
    _emit(
        out,
        "age-secret-key",
        lambda: age_secret_key(g),
        lambda k: k,
        lambda k: f"# created: 2024-06-11T10:02:44Z\n# public key: age1{g.s(_BECH32, 58)}\n{k}",
        lambda k: f"SOPS_AGE_KEY={k}",
    )
    _emit(
        out,
        "wireguard-private-key",
        lambda: wireguard_key(g),
        lambda k: (
            f"[Interface]\nAddress = 10.8.0.2/24\nPrivateKey = {k}\nDNS = 1.1.1.1\n\n[Peer]\n"
            f"PublicKey = {_b64(g.b(32))}\nEndpoint = vpn.northwind.io:51820\n"
        ),
        lambda k: f'wireguard:\n  private_key: "{k}"\n',
    )
    return out


def _private_keys(g: _Gen) -> list[Secret]:
    out: list[Secret] = []
    k = rsa_pkcs1_pem(g)
    out.append(S("rsa-private-key", k, k))
    k = rsa_pkcs1_pem(g, 4096)
    out.append(S("rsa-private-key", k, f"$ cat deploy/keys/github-app.pem\n{k}\n$ "))
    k = rsa_pkcs1_pem(g)
    indented = k.replace("\n", "\n    ")
    out.append(
        S(
            "rsa-private-key",
            indented,
            f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: tls\nstringData:\n  tls.key: |\n"
            f"    {indented}\n",
        )
    )
    k = rsa_pkcs1_pem(g)
    esc = k.replace("\n", "\\n")
    out.append(S("rsa-private-key", esc, f'GITHUB_APP_PRIVATE_KEY="{esc}"'))
    k = ec_pem(g)
    out.append(S("ec-private-key", k, k))
    k = ec_pem(g)
    out.append(S("ec-private-key", k, f'APPLE_PUSH_KEY = """{k}"""\n'))
    k = openssh_ed25519(g, "marta@build-03")
    out.append(S("openssh-private-key", k, k))
    k = openssh_ed25519(g, "deploy@orbitpay")
    out.append(S("openssh-private-key", k, f"$ cat ~/.ssh/id_ed25519\n{k}\n"))
    k = openssh_rsa(g)
    out.append(
        S(
            "openssh-private-key",
            k,
            "      - name: Install deploy key\n        run: |\n"
            f"          cat > ~/.ssh/id_rsa <<'EOF'\n{k}\nEOF\n",
        )
    )
    k = pkcs8_rsa_pem(g)
    out.append(S("pkcs8-private-key", k, k))
    k = pkcs8_ed25519_pem(g)
    out.append(S("pkcs8-private-key", k, f"signing_key = '''\n{k}\n'''\n"))
    k = encrypted_pkcs8_pem(g)
    out.append(S("encrypted-private-key", k, k))
    k = legacy_encrypted_rsa_pem(g)
    out.append(S("encrypted-private-key", k, f"$ cat server.key\n{k}\n"))
    k = pgp_private_block(g, "Release Signing <release@orbitpay.dev>")
    out.append(S("pgp-private-key-block", k, k))
    k = pgp_private_block(g, "Marta K <marta@northwind.io>")
    out.append(
        S("pgp-private-key-block", k, f"$ gpg --export-secret-keys --armor 0x{g.s(HEXU, 16)}\n{k}")
    )
    k = ppk_v3(g, "eddsa-key-20240611")
    out.append(S("putty-private-key", k, k))
    k = ppk_v3(g, "ops@jump-host")
    out.append(S("putty-private-key", k, f"Contents of C:\\Users\\ops\\keys\\jump.ppk:\n{k}\n"))
    return out


def _pypirc(g: _Gen) -> list[Secret]:
    tok = pypi_token(g)
    return [
        S(
            "pypi-upload-token",
            tok,
            "[distutils]\nindex-servers = pypi\n\n"
            f"[pypi]\nusername = __token__\npassword = {tok}\n",
        )
    ]


def S(family: str, value: str, text: str) -> Secret:
    if value not in text:
        raise ValueError(f"{family}: value not in text")
    return Secret(family, value, text)


def secrets() -> list[Secret]:
    """Every secret of the corpus, in a fixed order (same result on every call)."""
    g = _Gen(SEED)
    out: list[Secret] = []
    for spec in _SPECS:
        for kind in spec.ctxs:
            value = spec.gen(g)
            out.append(S(spec.family, value, _render(g, kind, value, spec)))
    for build in (_aws, _gcp, _azure, _pairs, _webhooks, _git_remotes, _conn_strings):
        out.extend(build(g))
    out.extend(_generic(g))
    out.extend(_private_keys(g))
    out.extend(_pypirc(g))
    bad = [s.family for s in out if not _clean(s.value)]
    if bad:
        raise ValueError(f"banned word in values of {bad}")
    return out


# --------------------------------------------------------------------------- hard negatives


def hard_negatives() -> list[tuple[str, str]]:
    """Secret-looking text that is not a secret and must be left as it is."""
    g = _Gen(7)
    sha1 = [g.hex(40) for _ in range(3)]
    sha256 = [g.hex(64) for _ in range(4)]
    uuids = [g.uuid4() for _ in range(4)]
    sri = _b64(hashlib.sha512(b"left-pad@1.3.0").digest())
    out: list[tuple[str, str]] = [
        (
            "git-sha",
            f"commit {sha1[0]}\nAuthor: Marta K <marta@northwind.io>\n\n    Fix retry loop",
        ),
        ("git-sha-log", f"{sha1[1][:7]} Merge pull request #412 from orbitpay/fix-ledger"),
        ("git-checkout", f"git checkout {sha1[2]} -- src/ledger/sync.py"),
        ("git-rev-parse", f"$ git rev-parse HEAD\n{g.hex(40)}"),
        ("sha256sum", f"{sha256[0]}  dist/orbit-ledger-2.14.1.tar.gz"),
        ("md5", f"MD5 (backup.tar) = {g.hex(32)}"),
        ("s3-etag", f'"ETag": "\\"{g.hex(32)}\\""'),
        ("uuid-request-id", json.dumps({"request_id": uuids[0], "status": "ok"})),
        ("uuid-session", f"session {uuids[1]} resumed at 2024-06-11T10:00:00Z"),
        ("azure-subscription-id", f"az account set --subscription {uuids[2]}"),
        ("azure-tenant-id", f"AZURE_TENANT_ID={uuids[3]}"),
        ("traceparent", f"traceparent: 00-{g.hex(32)}-{g.hex(16)}-01"),
        ("otel-span-id", json.dumps({"traceId": g.hex(32), "spanId": g.hex(16)})),
        ("sentry-event-id", f"Sentry event {g.hex(32)} captured"),
        ("mongo-objectid", f'{{"_id": {{"$oid": "{g.hex(24)}"}}, "name": "ledger"}}'),
        ("ulid", f"job_id=01HZX{g.s('0123456789ABCDEFGHJKMNPQRSTVWXYZ', 21)}"),
        ("base64-text", _b64(b"Hello from the ingest worker, this is an ordinary log message.")),
        ("base64-json-config", _b64(b'{"theme":"dark","sidebar":true,"fontSize":14}')),
        ("passwd-get", "passwd = conn_params.get('password', '')"),
        ("password-env", 'password = os.environ["DB_PASSWORD"]'),
        ("password-getenv", "db_password = os.getenv('DB_PASSWORD')"),
        ("token-header-get", 'token = request.headers.get("Authorization")'),
        ("fixture-password", "user = {'username': 'alice', 'password': 'somepassword'}"),
        ("fixture-hunter2", 'login(client, "bob", password="hunter2")'),
        ("api-key-none", "def __init__(self, api_key=None, timeout=30):"),
        ("pydantic-field", "    secret_key: str = Field(..., description='HMAC key')"),
        ("settings-secretstr", "    openai_api_key: SecretStr | None = None"),
        ("max-tokens", "response = client.messages.create(model=model, max_tokens=4096)"),
        ("auth-method", "auth_method: oidc\nissuer: https://token.actions.githubusercontent.com"),
        ("token-type", '{"token_type": "Bearer", "expires_in": 3600, "scope": "read"}'),
        ("redacted-key", "OPENAI_API_KEY=REDACTED_API_KEY"),
        ("angle-placeholder", 'curl -H "Authorization: Bearer <your-api-key>" https://api.x.ai/v1'),
        ("shell-var", "GITHUB_TOKEN=${GITHUB_TOKEN}"),
        ("shell-var-header", 'curl -H "Authorization: Bearer $TOKEN" "$API_URL/v1/me"'),
        ("gha-secret-ref", "NODE_AUTH_TOKEN: ${{ secrets.NPM_TOKEN }}"),
        ("jinja-secret-ref", "password: {{ vault_db_password }}"),
        ("process-env", "const stripe = new Stripe(process.env.STRIPE_SECRET_KEY);"),
        (
            "k8s-secret-ref",
            (
                "env:\n  - name: DB_PASSWORD\n    valueFrom:\n      secretKeyRef:\n"
                "        name: ledger-db\n        key: password\n"
            ),
        ),
        ("docker-secret-file", "POSTGRES_PASSWORD_FILE=/run/secrets/db_password"),
        ("cat-secret", 'export DB_PASSWORD="$(cat /run/secrets/db_password)"'),
        ("aws-configure-get", 'AWS_SECRET_ACCESS_KEY="$(aws configure get aws_secret_access_key)"'),
        ("empty-env", "AWS_SECRET_ACCESS_KEY=\nAWS_ACCESS_KEY_ID="),
        ("output-waiting-id", "sk-output-waiting-1712345678"),
        ("aws-docs-key-id", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE"),
        ("aws-docs-secret", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("masked-key", "OPENAI_API_KEY=sk-proj-****************************************Qz1a"),
        ("masked-key-ellipsis", "Using key sk-ant-...7fQ2 (from ANTHROPIC_API_KEY)"),
        ("masked-stars", 'password: "********"'),
        ("prefix-only", "GitHub classic tokens start with ghp_ and npm tokens with npm_."),
        ("npm-integrity", f'"integrity": "sha512-{sri}"'),
        ("sri-script", f'<script src="/app.js" integrity="sha384-{_b64(g.b(48))}"></script>'),
        ("docker-digest", f"ghcr.io/orbitpay/api@sha256:{sha256[1]}"),
        ("docker-pull", f"Digest: sha256:{sha256[2]}\nStatus: Downloaded newer image"),
        ("cargo-lock", f'checksum = "{sha256[3]}"'),
        ("go-sum", f"golang.org/x/net v0.24.0 h1:{_b64(g.b(32))}"),
        ("poetry-hash", f'{{file = "requests-2.32.3.tar.gz", hash = "sha256:{g.hex(64)}"}}'),
        (
            "git-lfs-pointer",
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{g.hex(64)}\nsize 1843",
        ),
        ("file-path-ssh", "Identity file /home/marta/.ssh/id_ed25519 type 3"),
        ("file-path-secrets", "src/secrets/token_provider.py:88: in refresh"),
        ("kafka-offset", "partition=3 offset=18446744 key=ledger-7f3a lag=0"),
        ("pg-lsn", "replication slot ledger_slot: restart_lsn 0/16B3748, confirmed 0/16B37F0"),
        (
            "claude-tool-id",
            f'{{"type": "tool_use", "id": "toolu_01{g.s(ALNUM, 22)}", "name": "Bash"}}',
        ),
        ("claude-msg-id", f'"id": "msg_01{g.s(ALNUM, 22)}", "model": "claude-opus-4-6"'),
        ("claude-request-id", f"request-id: req_011C{g.s(ALNUM, 20)}"),
        ("openai-chatcmpl", f'"id": "chatcmpl-{g.s(ALNUM, 29)}", "object": "chat.completion"'),
        ("openai-call-id", f'"call_id": "call_{g.s(ALNUM, 24)}", "type": "function_call"'),
        ("openai-resp-id", f'"id": "resp_{g.hex(48)}"'),
        ("openai-org-id", f"OpenAI-Organization: org-{g.s(ALNUM, 24)}"),
        ("openai-file-id", f"file-{g.s(ALNUM, 22)} uploaded (purpose=batch)"),
        (
            "png-base64",
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42"
            "mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        ),
        (
            "ssh-public-key",
            f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{_b64(g.b(32))[:43]} marta@build-03",
        ),
        (
            "certificate-pem",
            (
                "-----BEGIN CERTIFICATE-----\n"
                "MIIBszCCAVmgAwIBAgIUQ2VydGlmaWNhdGUgYm9keSBpcyBwdWJsaWMw\n"
                "-----END CERTIFICATE-----"
            ),
        ),
        (
            "public-key-pem",
            (
                "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA" + _b64(g.b(32))[:43] + "=\n"
                "-----END PUBLIC KEY-----"
            ),
        ),
        (
            "kubeconfig-ca",
            "    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1J"
            "SUMvakNDQWVhZ0F3SUJBZ0lCQURBTkJna3Foa2lHOXcwQkFRc0ZBREFWTVJNd0VRWURWUVFERXdwcmRXSmwK",
        ),
        ("password-policy", "Password must be at least 12 characters and include a digit."),
        ("password-prompt", "Enter passphrase for key '/home/ops/.ssh/id_rsa':"),
        ("token-usage", "tokens_sent: 28434, tokens_received: 4536, total_cost: 0.153342"),
        ("token-budget", "context window exceeded: 167094 tokens > 160000 token budget"),
        (
            "secret-scanning-config",
            "secret_scanning:\n  status: enabled\n  push_protection: enabled",
        ),
        ("arn", "arn:aws:iam::123456789012:role/ledger-deployer"),
        ("aws-account-id", "AWS_ACCOUNT_ID=123456789012"),
        ("model-name", "model: claude-3-5-sonnet-20241022"),
        ("semver", "orbit-ledger==2.14.1  # pinned, see CHANGELOG"),
        ("webpack-chunk", f"static/js/main.{g.hex(8)}.chunk.js  182.4 kB"),
        ("cache-key", 'key: v1-deps-{{ checksum "package-lock.json" }}'),
        ("hex-color", "--brand-primary: #1f6feb; --brand-accent: #f78166;"),
        ("ipv6", "listening on [2001:db8:85a3::8a2e:370:7334]:8443"),
        ("mac-address", "ether 3c:22:fb:9a:41:0e txqueuelen 1000"),
        ("discord-snowflake", "message 1249998463712301087 in channel 1096123456789012345"),
        ("gh-run-id", "https://github.com/orbitpay/ledger/actions/runs/9468213357/job/26083341172"),
        (
            "stripe-object-id",
            "charge ch_3PQ1a2LkdIwHu7ix0bC3dEfG refunded (pi_3PQ1a2LkdIwHu7ix0aB1cD2e)",
        ),
        ("publishable-key-doc", "Use your publishable key (pk_live_...) in the browser only."),
        ("slack-channel-id", "posted to channel C04ABCD1234 as user U02XYZ98765"),
        ("env-example", "DATABASE_URL=postgresql://user:password@localhost:5432/dbname"),
        ("url-no-password", "DATABASE_URL=postgresql://ledger@db.internal:5432/ledger"),
        ("localhost-default", "redis://localhost:6379/0"),
        ("jwt-header-only", 'JWT header is base64url of {"alg":"HS256","typ":"JWT"}'),
        ("pytest-id", "tests/unit/test_auth.py::test_token_refresh[expired-token] PASSED"),
        ("lorem-hex-table", "offset 0x00000040: 4865 6c6c 6f20 576f 726c 640a  Hello World."),
        ("version-hash", f"Python 3.11.7 (main, {g.hex(7)}, Jan 18 2024) [GCC 11.4.0]"),
    ]
    return out
