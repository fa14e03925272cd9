"""At least 100 secrets in their real formats (random values, fixed seed), each in a context
where agents meet them: env dumps, config files, URLs, headers, JSON, logs."""

from __future__ import annotations

import base64
import json
import random
import string

_rng = random.Random(20261130)
ALNUM = string.ascii_letters + string.digits
UPPER32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def _r(alphabet: str, n: int) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _b64url(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _jwt() -> str:
    header = _b64url({"alg": "HS256", "typ": "JWT"})
    payload = _b64url(
        {"sub": _r(string.digits, 8), "iat": _rng.randrange(1_600_000_000, 1_800_000_000)}
    )
    return f"{header}.{payload}.{_r(ALNUM + '-_', 43)}"


def _private_key(kind: str) -> str:
    body = "\n".join(_r(ALNUM + "+/", 64) for _ in range(6))
    return f"-----BEGIN {kind}PRIVATE KEY-----\n{body}\n-----END {kind}PRIVATE KEY-----"


def corpus() -> list[tuple[str, str, str]]:
    """(name, secret value, text containing it)."""
    items: list[tuple[str, str, str]] = []

    def add(name: str, secret: str, text: str) -> None:
        items.append((name, secret, text))

    for prefix in ("AKIA", "ASIA") * 6:
        key = prefix + _r(UPPER32, 16)
        add("aws_key_id", key, f"AWS_ACCESS_KEY_ID={key}")
    for _ in range(8):
        secret = _r(ALNUM + "/+", 40)
        add("aws_secret", secret, f"aws_secret_access_key = {secret}")
    for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_") * 2:
        tok = prefix + _r(ALNUM, 36)
        add("github", tok, f"git clone https://x-access-token@github.com/o/r # {tok}")
    for _ in range(4):
        tok = "github_pat_" + _r(ALNUM, 22) + "_" + _r(ALNUM, 59)
        add("github_pat", tok, f"export GH_PAT_FOR_CI={tok}")
    for _ in range(8):
        tok = "glpat-" + _r(ALNUM + "-_", 20)
        add("gitlab", tok, f"Using token {tok} for the registry")
    for prefix in ("xoxb-", "xoxp-", "xoxa-", "xoxr-") * 2:
        tok = prefix + "-".join(_r(string.digits, 12) for _ in range(2)) + "-" + _r(ALNUM, 24)
        add("slack", tok, f"slack_client = WebClient(token='{tok}')")
    for _ in range(4):
        url = (
            "https://hooks.slack.com/services/T"
            + _r(UPPER32, 8)
            + "/B"
            + _r(UPPER32, 8)
            + "/"
            + _r(ALNUM, 24)
        )
        add("slack_webhook", url, f"POST {url}")
    for kind in ("RSA ", "EC ", "OPENSSH ", "", "DSA ", "ENCRYPTED "):
        key = _private_key(kind)
        add("private_key", key, f"cat ~/.ssh/id\n{key}\n")
    for _ in range(10):
        tok = _jwt()
        add("jwt", tok, f"cookie: session={tok}; Path=/")
    for scheme in ("postgres", "mysql", "redis", "amqp", "https", "mongodb+srv") * 2:
        pw = _r(ALNUM + "!$%^*", 14)
        add("url_password", pw, f"DATABASE_URL used: {scheme}://svc_user:{pw}@db.internal:5432/app")
    for name in (
        "DB_PASSWORD",
        "SECRET_KEY",
        "STRIPE_API_KEY",
        "JWT_SECRET",
        "REDIS_PASSWORD",
        "SMTP_PASSWD",
        "OAUTH_CLIENT_SECRET",
        "SENTRY_AUTH_TOKEN",
        "NPM_TOKEN",
        "DOCKER_PASSWORD",
    ):
        val = _r(ALNUM, 18)
        add("env_line", val, f"HOME=/root\n{name}={val}\nPATH=/usr/bin")
    for _ in range(8):
        tok = _r(ALNUM + "-._~", 32)
        add("bearer", tok, f"curl -H 'Authorization: Bearer {tok}' https://api.internal/v1")
    for _ in range(4):
        tok = "sk-ant-api03-" + _r(ALNUM + "-_", 80)
        add("anthropic", tok, f"ANTHROPIC_KEY_USED {tok}")
    for _ in range(4):
        tok = "sk-proj-" + _r(ALNUM + "-_", 48)
        add("openai", tok, f'client = OpenAI(api_key="{tok}")')
    for _ in range(3):
        tok = "sk_live_" + _r(ALNUM, 24)
        add("stripe", tok, f"stripe.api_key = {tok}")
    for _ in range(3):
        tok = "AIza" + _r(ALNUM + "-_", 35)
        add("google", tok, f"maps key {tok} loaded")
    for key in (
        "client_secret",
        "apiKey",
        "access_token",
        "password",
        "signing_key",
        "private_key",  # not private_key_id: that names a key (a GCP key's id), it is no secret
    ):
        val = _r(ALNUM, 24)
        add("json_keyed", val, json.dumps({"name": "svc", key: val, "region": "eu-west-1"}))
    return items
