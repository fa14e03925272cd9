"""Make the public secret corpora (issue 27) from other scanners' rule files.

Two steps, each runnable alone::

    python tests/data/secrets/fetch.py fetch noseyparker   # needs network and PyYAML
    python tests/data/secrets/fetch.py build                # needs PyYAML only

Sources: ``noseyparker``, ``kingfisher`` (held-out third), ``kingfisher-tuning`` (another third),
``secretlint`` (snapshots, see ``build_secretlint``) and ``veles``, ``veles2``, ``veles3`` (the
detector tests of google/osv-scalibr, see ``build_veles``), ``detectsecrets`` (the plugin tests of
Yelp/detect-secrets, see ``build_detectsecrets``), ``whispers`` (Skyscanner/whispers' fixtures, see
``build_whispers``), ``ripsecrets`` (sirwart/ripsecrets' test files, see ``build_ripsecrets``),
``trivy`` (aquasecurity/trivy's test data, see ``build_trivy``) and ``kics`` (Checkmarx/kics'
positive tests of its secrets query, see ``build_kics``).
The hand-copied sources share one writer (``write_rows``), one builder for cases that name their
credential (``build_wanted``) and one downloader (``fetched_texts``).

``fetch`` downloads every rule file listed in ``<source>-rules.yml`` from GitHub at the commit
recorded there (``raw.githubusercontent.com/<repo>/<commit>/<path>``) and writes the trimmed copy
again: for each rule its id, name, categories, pattern and positive ``examples``, verbatim (negative
examples, references and descriptions are left out). The stored copies were made by hand from a
stored index of the same files because the machine they were made on had no network, so ``fetch``
is also the way to check them.

``build`` turns each trimmed copy into ``<source>.jsonl``, one line per positive example, and
``<source>.patterns.json`` (rule id -> pattern, so the tests need no YAML library)::

    {"source", "rule", "name", "example", "secret", "how", "file", "commit"}

``secret`` is the value a detector must hide. ``how`` says how it was found:

- ``capture``: the rule's own regex (Python ``re``; Nosey Parker's and Kingfisher's are
  Hyperscan/Rust syntax, which ``re`` reads for all but a few) matched the example and the
  secret is the capture group that holds it: the named group ``TOKEN`` if there is one
  (Kingfisher's convention), else the group named in ``SECRET_GROUP`` below (rules whose last group
  is a host or a database), else the last group that matched (these rules capture the user
  before the password, the id before the secret), else the whole match; when that group is
  shorter than 6 characters (a rule that captures only the prefix, ``(s|hvs)\\.``), the whole
  match.
  Before matching, the syntax ``re`` lacks is translated: POSIX classes (``[[:alnum:]]``,
  ``[[:xdigit:]]``, ``[[:alpha:]]``, ``[[:digit:]]``, ``[[:blank:]]``, ``[[:space:]]``) become
  their ``re`` classes, and global flags written mid-pattern move to the front.
- ``heuristic``: the regex does not compile in ``re`` or does not match its own example; the
  secret is then the longest run of 16+ characters from ``[A-Za-z0-9+/=_.~-]`` in the example
  (the random part of a token), if any.

An example is **dropped**, with its reason counted in ``<source>.dropped.json``, when:

- ``not-a-secret``: its rule finds something that is no credential: for Nosey Parker the ids in
  ``NOT_SECRET`` (client ids, account ids, public keys, bucket names, ARNs, password hashes,
  domains); for Kingfisher the rules it marks ``visible: false`` (the ids, hosts and names its
  validators need beside a secret) and those whose name ends in "Client ID";
- ``no-value``: neither the regex nor the heuristic found a value;
- ``short``: the value is under 8 characters (``pass123``, ``admin``);
- ``placeholder``: the value is a placeholder or an obvious fake: 4 or more of one character in a
  row (``aaaa``, ``xxxx``, ``0000``), ``0123456``/``abcdef`` runs, ``example``, a reference
  (``$VAR``, ``${{ }}``, ``%VAR%``, ``#{...}``, ``<...>``), or letters and ``_`` only with a
  placeholder word in it (``SOME_PASSWORD``, ``smtp_password``, ``thisismypassword``);
- ``duplicate``: the same rule and example text again.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCES = (
    "noseyparker",
    "kingfisher",
    "secretlint",
    "kingfisher-tuning",
    "veles",
    "veles2",
    "veles3",
    "veles4",
    "kingfisher5",
    "veles5",
    "kingfisher6",
    "kingfisher7",
    "kingfisher8",
    "kingfisher9",
    "kingfisher10",
    "kingfisher11",
    "kingfisher12",
    "kingfisher13",
    "detectsecrets",
    "whispers",
    "ripsecrets",
    "trivy",
    "kics",
    "leaktk",
    "leakyrepo",
    "sarifpm",
)

# Rules that find something other than a credential (by id; the reason is in the rule's name).
NOT_SECRET = frozenset(
    {
        "np.age.1",  # public key
        "np.aws.3",  # account id
        "np.s3.1",
        "np.s3.2",
        "np.arn.1",
        "np.gcs.1",
        "np.gcs.2",  # bucket names, ARNs
        "np.blynk.4",
        "np.blynk.5",
        "np.github.5",
        "np.google.1",
        "np.linkedin.1",
        "np.twitter.1",
        "np.reactapp.1",  # client ids, usernames
        "np.mapbox.1",  # public token
        "np.shopify.1",  # domain
        "np.pwhash.1",
        "np.pwhash.2",
        "np.pwhash.3",
        "np.pwhash.4",
        "np.pwhash.5",  # password hashes
        "kingfisher.pwhash.1",
        "kingfisher.pwhash.2",
        "kingfisher.pwhash.3",
        "kingfisher.pwhash.4",
        "kingfisher.pwhash.5",
        "kingfisher.krb5.asrep.23.1",  # the same hashes in Kingfisher's rules (kingfisher6)
        "np.pem.2",  # examples not copied (see the note in the trimmed file)
    }
)
# Rules whose last capture group is not the secret: the password is group 2 (user, password,
# host, database; Kingfisher's URL credentials: user, password, host, path).
SECRET_GROUP = {"np.mongodb.1": 2, "np.postgres.1": 2, "kingfisher.credentials.1": 2}

_RUN = re.compile(r"[A-Za-z0-9+/=_.~-]{16,}")
_NAME = re.compile(r"^[A-Za-z_-]+$")
_SAME4 = re.compile(r"(.)\1{3,}")
_REFERENCE = re.compile(r"^\$|\$\{|\$\(|^%[A-Za-z_]+%?|#\{|^<.*>$|\{\{")
_WORDY = re.compile(r"^[A-Za-z_]+$")
_PLACEHOLDER_WORDS = ("pass", "secret", "your", "some", "token", "username", "example")


def placeholder(value: str) -> bool:
    lowered = value.lower()
    if _SAME4.search(value) or "0123456" in value or "abcdef" in lowered:
        return True
    if "example" in lowered or _REFERENCE.search(value):
        return True
    if value.endswith(":"):  # a label in code ("application:" + appKey), not a value
        return True
    return bool(_WORDY.match(value)) and any(w in lowered for w in _PLACEHOLDER_WORDS)


def _group(rule_id: str, m: re.Match[str]) -> str:
    names = m.re.groupindex
    if "TOKEN" in names and m.group("TOKEN"):
        value = m.group("TOKEN")
    elif rule_id in SECRET_GROUP:
        value = m.group(SECRET_GROUP[rule_id])
    else:
        matched = [i for i in range(1, (m.re.groups or 0) + 1) if m.group(i)]
        # a named group inside another (``(?P<body>..)(?P<checksum>..)`` within group 1) is a
        # part of the value, not the value
        inner = {
            names[n]
            for n in names
            for j in matched
            if names[n] != j
            and m.start(j) <= m.start(names[n])
            and m.end(names[n]) <= m.end(j)
            and names[n] in matched
        }
        matched = [i for i in matched if i not in inner] or matched
        value = m.group(matched[-1]) if matched else m.group(0)
    whole = m.group(0).strip()
    if len(value) < 6 and whole.startswith(value) and len(whole) > len(value):
        value = whole  # the group is only the prefix (``(s|hvs)\\.``)
    return value.strip().strip("\"'")


_FLAGS = re.compile(r"\(\?([imsx]+)\)")


_POSIX = {
    "[:alnum:]": "A-Za-z0-9",
    "[:xdigit:]": "0-9A-Fa-f",
    "[:alpha:]": "A-Za-z",
    "[:digit:]": "0-9",
    "[:blank:]": " \\t",
    "[:space:]": "\\s",
}


def _posix(pattern: str) -> str:
    for name, chars in _POSIX.items():
        pattern = pattern.replace(name, chars)
    return pattern


def not_secret(rule: dict[str, Any]) -> bool:
    """A rule that finds no credential (see the module docstring)."""
    if rule["id"] in NOT_SECRET or rule.get("visible") is False:
        return True
    return str(rule.get("name", "")).endswith(("Client ID", "Role ID"))  # ids, as veles' RoleID


def _flags_first(pattern: str) -> str:
    """Global flags written mid-pattern (``(?s)`` after other text, which Rust allows and
    ``re`` refuses) moved to the front."""
    flags = "".join(sorted({f for group in _FLAGS.findall(pattern) for f in group}))
    return f"(?{flags})" + _FLAGS.sub("", pattern) if flags else pattern


def extract(rule_id: str, pattern: str | None, example: str) -> tuple[str | None, str]:
    """The secret in ``example`` and how it was found (``capture`` or ``heuristic``)."""
    if pattern:
        m = None
        pattern = _posix(pattern)
        for candidate in (pattern, _flags_first(pattern)):
            try:
                m = re.search(candidate, example)
                break
            except re.error:
                continue
        if m is not None:
            return _group(rule_id, m), "capture"
    # a name (letters, ``_`` and ``-`` only: ``airtable_api_key``) is no token's random part
    runs = [r for r in _RUN.findall(example) if not _NAME.match(r)]
    runs = sorted(runs, key=len, reverse=True)
    return (runs[0], "heuristic") if runs else (None, "heuristic")


def rule_files(source: str) -> dict[str, Any]:
    """The trimmed copy of a rule-file source: ``<source>-rules.json`` (copied as JSON, no YAML
    library needed) or ``<source>-rules.yml``."""
    copied = HERE / f"{source}-rules.json"
    if copied.exists():
        return dict(json.loads(copied.read_text(encoding="utf-8")))
    import yaml  # type: ignore[import-untyped]  # build-time only: the tests read the JSONL

    return dict(yaml.safe_load((HERE / f"{source}-rules.yml").read_text(encoding="utf-8")))


def build(source: str) -> tuple[list[dict[str, Any]], Counter[str]]:
    doc = rule_files(source)
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for f in doc["files"]:
        for rule in f["rules"]:
            for example in rule.get("examples") or ():
                example = str(example)
                if not_secret(rule):
                    dropped["not-a-secret"] += 1
                    continue
                if (rule["id"], example) in seen:
                    dropped["duplicate"] += 1
                    continue
                seen.add((rule["id"], example))
                secret, how = extract(rule["id"], rule.get("pattern"), example)
                if not secret:
                    dropped["no-value"] += 1
                elif len(secret) < 8:
                    dropped["short"] += 1
                elif placeholder(secret):
                    dropped["placeholder"] += 1
                else:
                    rows.append(
                        {
                            "source": source,
                            "rule": rule["id"],
                            "name": rule.get("name", ""),
                            "example": example,
                            "secret": secret,
                            "how": how,
                            "file": f["path"],
                            "commit": f["commit"],
                        }
                    )
            if not_secret(rule) and not rule.get("examples"):
                dropped["not-a-secret (rules, examples not copied)"] += 1
    return rows, dropped


def write(source: str) -> None:
    rows, dropped = build(source)
    with (HERE / f"{source}.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    doc = rule_files(source)
    kept = {r["rule"] for r in rows}
    patterns = {
        rule["id"]: rule["pattern"]
        for f in doc["files"]
        for rule in f["rules"]
        if rule["id"] in kept and rule.get("pattern")
    }
    (HERE / f"{source}.patterns.json").write_text(json.dumps(patterns, indent=1) + "\n")
    summary: dict[str, Any] = {"kept": len(rows), "dropped": dict(sorted(dropped.items()))}
    summary["by_how"] = dict(Counter(r["how"] for r in rows))
    (HERE / f"{source}.dropped.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(source, json.dumps(summary))


# secretlint (the third source, tuning): its snapshot tests' ``output.json`` give the text
# (``sourceContent``) and what the rule found (``messages[].data``), copied into
# ``secretlint-snapshots.jsonl`` (path, commit, rule package, found values, source text).
SECRETLINT_REPO = "secretlint/secretlint"
# The literal each secretlint format starts with (its documented token format): the value is
# "prefixed" when it starts with one (as Nosey Parker's and Kingfisher's capture literals).
SECRETLINT_PREFIXES = (
    "dapi", "ops_eyJ", "sk-ant-api0", "AKIA", "cfat_", "cfut_", "cfk_", "dckr_pat_", "figd_",
    "ghp_", "ghs_", "github_pat_", "glpat-", "glc_", "glsa_", "gsk_", "hvs.", "hvb.", "hvr.",
    "hf_", "lin_api_", "ntn_", "sk-proj-", "sk-svcacct-", "sk-admin-", "npm_", "SG.", "shpss_",
    "shpat_", "shpca_", "shppa_", "sk_live_", "sk_test_", "rk_live_", "rk_test_", "xoxa-",
    "xoxb-", "xoxo-", "xoxp-", "xapp-", "tskey-", "vcp_", "vci_", "vca_", "vcr_", "vck_",
    "https://hooks.slack.com/services/", "sk-",
)  # fmt: skip
_URL_PASSWORD = re.compile(r"://([^:/\s@]+):(.*)@([^@/\s]+)")


def secretlint_value(found: str) -> str:
    """The secret in what a secretlint rule reported: a URL's password for the basic-auth and
    connection-string rules (``scheme://user:password@host``, the password possibly holding
    ``@``), else the reported value (Slack webhooks: the whole URL)."""
    found = found.rstrip("\"';)")
    m = _URL_PASSWORD.search(found)
    if m and "hooks.slack.com" not in found:
        return m.group(2)
    return found


def build_secretlint() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for line in (HERE / "secretlint-snapshots.jsonl").read_text(encoding="utf-8").splitlines():
        snap = json.loads(line)
        if not snap["found"]:
            dropped["no-message (the snapshot reports nothing)"] += 1
            continue
        rule = "sl." + snap["rule"].removeprefix("secretlint-rule-")
        lines = snap["source"].splitlines()
        for found in snap["found"]:
            secret = secretlint_value(found)
            example = next(text for text in lines if found.rstrip("\"';)") in text)
            if (rule, example) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((rule, example))
            if len(secret) < 8:
                dropped["short"] += 1
            elif placeholder(secret):
                dropped["placeholder"] += 1
            else:
                prefix = next((p for p in SECRETLINT_PREFIXES if secret.startswith(p)), "")
                rows.append(
                    {
                        "source": "secretlint",
                        "rule": rule,
                        "name": snap["rule"],
                        "example": example,
                        "secret": secret,
                        "how": "reported",
                        "prefix": prefix,
                        "file": snap["path"],
                        "commit": snap["commit"],
                    }
                )
    return rows, dropped


def write_rows(
    source: str, rows: list[dict[str, Any]], dropped: Counter[str], per_file: bool = False
) -> None:
    """Write ``<source>.jsonl`` (one row a line) and ``<source>.dropped.json`` (kept, dropped by
    reason, prefixed, files): the one writer of every source built from hand-copied cases."""
    with (HERE / f"{source}.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    summary: dict[str, Any] = {"kept": len(rows), "dropped": dict(sorted(dropped.items()))}
    summary["prefixed"] = sum(1 for r in rows if r["prefix"])
    if source != "secretlint":
        summary["files"] = len({r["file"] for r in rows})
    if per_file:
        summary["per_file"] = dict(sorted(Counter(r["file"] for r in rows).items()))
    (HERE / f"{source}.dropped.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(source, json.dumps(summary))


def fetched_texts(repo: str, cases: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Each file the cases name, downloaded once at its commit from GitHub (``fetch`` only)."""
    texts: dict[tuple[str, str], str] = {}
    for case in cases:
        key = (case["path"], case["commit"])
        if key not in texts:
            url = f"https://raw.githubusercontent.com/{repo}/{key[1]}/{key[0]}"
            with urllib.request.urlopen(url.replace(" ", "%20"), timeout=30) as response:
                texts[key] = response.read().decode("utf-8")
    return texts


def copied_cases(name: str) -> list[dict[str, Any]]:
    """The hand-copied lines of ``<name>.jsonl`` (``veles-tests``, ``whispers-tests``, ...)."""
    text = (HERE / f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def wanted_row(
    source: str, rule: str, case: dict[str, Any], value: str, prefixes: tuple[str, ...]
) -> dict[str, Any]:
    """One corpus row of a case that names the credential it holds (``want``)."""
    return {
        "source": source,
        "rule": rule,
        "name": case.get("test", ""),
        "example": case["input"],
        "secret": value,
        "how": "wanted",
        "prefix": next((p for p in prefixes if value.startswith(p)), ""),
        "file": case["path"],
        "commit": case["commit"],
    }


def keep(value: str, dropped: Counter[str]) -> bool:
    """The drop rules every source shares (after its own not-a-secret and duplicate checks)."""
    if not value:
        dropped["no-value"] += 1
    elif len(value) < 8:
        dropped["short"] += 1
    elif placeholder(value):
        dropped["placeholder"] += 1
    else:
        return True
    return False


def fetch_secretlint() -> None:
    """Download each snapshot's output.json at its commit and check the stored copy."""
    path = HERE / "secretlint-snapshots.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        snap = json.loads(line)
        url = f"https://raw.githubusercontent.com/{SECRETLINT_REPO}/{snap['commit']}/{snap['path']}"
        with urllib.request.urlopen(url.replace(" ", "%20"), timeout=30) as response:
            doc = json.loads(response.read().decode("utf-8"))
        found = [next(iter(m["data"].values())) for m in doc["messages"] if m.get("data")]
        assert doc["sourceContent"] == snap["source"], snap["path"]
        assert [f for f in found if f in snap["source"]] == snap["found"], snap["path"]


# veles (the fifth source, HELD OUT, fourth round): the positive cases of the detector tests of
# google/osv-scalibr's secret scanner (``veles/secrets/*/detector_test.go``), copied by hand into
# ``veles-tests.jsonl`` after the detector was frozen (commit bcd9e89): one line per wanted secret
# of a positive case, with the Go test's input as the test evaluates it (its ``fmt.Sprintf`` and
# ``+`` applied) and the string fields of the wanted secret (``want``).
VELES_REPO = "google/osv-scalibr"
# Fields of a wanted secret that are no credential: ids, a public key (VAPID's PublicB64) and the
# patterns of a non-credential detector (agentsandboxexfil reports exfiltration patterns). A
# wanted value the input does not hold as text (tinkkeyset's tests compare parsed JSON) is left
# out too (``not-in-input``).
VELES_NOT_SECRET = frozenset(
    {"AccessID", "AccessKeyID", "ClientID", "ID", "RoleID", "Username", "Pattern", "PublicB64"}
)
# The literal each format starts with (documented token formats; an access id's LTAI is an id).
VELES_PREFIXES = (
    "sk-ant-api", "sk-ant-admin", "CCIPAT_", "CCIPRJ_", "CLOJARS_", "sk-co-",
    # the second slice (veles2)
    "cio", "key_", "dop_v1_", "dckr_pat_", "essu_", "AIza", "ya29.", "GOCSPX-", "glpat-",
    "ATCTT3xFfGN0",
    # the third slice (veles3)
    "xai-", "hf_", "sk-or-v1-", "hvs.", "hvb.", "ops_eyJ", "1PRK-", "A3-", "sk-proj-", "eyJ", "sk-",
    # the fourth slice (veles4; a reCAPTCHA secret's "6L" is under 3 characters)
    "packagist_ack_", "packagist_acs_", "sk_test_", "pplx-", "PMAK-", "PMAT-", "pypi-AgEI",
    "xapp-", "xoxe.xoxp-", "xoxe-",
    # the fifth slice (veles5; a Telegram bot token starts with digits)
    "sk_live_", "rk_live_", "whsec_",
)  # fmt: skip


def build_veles(source: str = "veles") -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str, str]] = set()
    for case in copied_cases(f"{source}-tests"):
        rule = "veles." + case["path"].removeprefix("veles/secrets/").rsplit("/", 1)[0].replace(
            "/", "."
        )
        for field, value in case["want"].items():
            if field in VELES_NOT_SECRET:
                dropped["not-a-secret"] += 1
                continue
            if field == "FullURL":  # basicauth: the password in the URL
                m = _URL_PASSWORD.search(value)
                value = m.group(2) if m else ""
            if (rule, case["input"], value) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((rule, case["input"], value))
            if value and value not in case["input"]:  # the test compares a parsed form
                dropped["not-in-input"] += 1
            elif keep(value, dropped):
                rows.append(wanted_row(source, rule, case, value, VELES_PREFIXES))
    return rows, dropped


def fetch_veles(source: str = "veles") -> None:
    """Download each test file at its commit and check that the stored case is in it: its test
    name, and each wanted value or the constant it was built from (a check of the copy, not a Go
    evaluator)."""
    cases = copied_cases(f"{source}-tests")
    texts = fetched_texts(VELES_REPO, cases)
    for case in cases:
        text = texts[(case["path"], case["commit"])]
        leaf = case["test"].split("/")[-1]
        assert leaf in text, (case["path"], leaf)
        for value in case["want"].values():
            assert value in text or value[:-1] in text or value[1:] in text, (case["path"], value)


DETECTSECRETS_REPO = "Yelp/detect-secrets"
# Fields that are no credential: an AWS access key id, an OAuth client id, a PuTTY file header,
# a candidate the test itself calls a false secret (aws_key_test: "TEST" * 10).
DETECTSECRETS_NOT_SECRET = frozenset({"AccessKeyID", "ClientID", "Header", "Candidate"})
# The literal each format starts with (the providers' documented prefixes).
DETECTSECRETS_PREFIXES = (
    "AVNS_", "ABSK", "bedrock-api-key-", "AIza", "ghp_", "glpat-", "gldt-", "glsoat-", "glsa_",
    "glc_", "hvs.", "eyJ", "sk-proj-", "sk-", "pypi-", "SG.", "xoxp-", "xoxo-", "xoxs-", "xoxa-",
    "xoxr-", "xoxb-", "sk_live_", "rk_live_", "npm_", "sq0csp-",
)  # fmt: skip


def build_detectsecrets() -> tuple[list[dict[str, Any]], Counter[str]]:
    """Each line of ``detectsecrets-tests.jsonl`` is one positive case of a plugin test of
    Yelp/detect-secrets (``tests/plugins/*_test.py``: a ``should_flag`` True payload, or a
    payload of a positives list), the input as the test builds it (``format()`` applied by hand)
    and the credential it holds (``want``; read by hand from the payload: the password of a
    connection string, the key after its name, the whole token). The same drop rules as the
    other sources, and a case whose input and value another plugin's test already gave is a
    duplicate (``gh_tight`` and ``gh_v2`` repeat ``gh_enterprise``'s lines)."""
    return build_wanted(
        "detectsecrets",
        lambda case: "ds." + case["path"].removeprefix("tests/plugins/").removesuffix("_test.py"),
        DETECTSECRETS_NOT_SECRET,
        DETECTSECRETS_PREFIXES,
    )


def build_wanted(
    source: str,
    rule_of: Callable[[dict[str, Any]], str],
    not_secret_fields: frozenset[str],
    prefixes: tuple[str, ...],
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The rows of ``<source>-tests.jsonl`` whose lines name the credential each holds
    (``want``: field -> value): fields in ``not_secret_fields`` are no credential, a repeated
    input and value is a duplicate, then the shared drop rules (``keep``)."""
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for case in copied_cases(f"{source}-tests"):
        for field, value in case["want"].items():
            if field in not_secret_fields:
                dropped["not-a-secret"] += 1
                continue
            if (case["input"], value) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((case["input"], value))
            if keep(value, dropped):
                rows.append(wanted_row(source, rule_of(case), case, value, prefixes))
    return rows, dropped


def fetch_wanted(repo: str, source: str) -> None:
    """Download each file the cases of ``<source>-tests.jsonl`` name at its commit and check
    that each stored value, or the part of it the test formats in, is in it (a check of the
    copy, not an evaluator)."""
    cases = copied_cases(f"{source}-tests")
    texts = fetched_texts(repo, cases)
    for case in cases:
        text = texts[(case["path"], case["commit"])]
        for value in case["want"].values():
            assert value[:24] in text or value[-24:] in text, (case["path"], value)


# whispers (the ninth source, TUNING, issue 27's eighth round): the fixture files of
# Skyscanner/whispers' tests (``tests/fixtures/*``: config files, shell, Dockerfile, source code in
# six languages), each noncompliant line (or the few lines a multi-line value spans) copied by
# hand into ``whispers-tests.jsonl`` with the value whispers must report (``want``).
WHISPERS_REPO = "Skyscanner/whispers"
# An AWS access key id, password hashes (htpasswd, Jenkins' jbcrypt) and an HTML comment are
# no credential here (as for the other sources).
WHISPERS_NOT_SECRET = frozenset({"AccessKeyID", "Hash", "Comment"})
WHISPERS_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "glsa_", "glc_", "eyJ")


def build_whispers() -> tuple[list[dict[str, Any]], Counter[str]]:
    return build_wanted(
        "whispers",
        lambda case: "wh." + case["path"].removeprefix("tests/fixtures/").lstrip("."),
        WHISPERS_NOT_SECRET,
        WHISPERS_PREFIXES,
    )


# ripsecrets (the tenth source, HELD OUT, eighth round): the test files of sirwart/ripsecrets
# (``test/one_per_line/*``: every line holds one secret; ``test/one_per_file/aws_json``), copied
# whole into ``ripsecrets-tests.jsonl`` (path, commit, text). Unlike the hand-read sources, the
# value of each line is found by a rule fixed before the copy was made (``ripsecrets_value``):
# the match of one of ripsecrets' own format regexes (``RIPSECRETS_FORMATS``, its
# ``predefined_secret_regexes``), else a URL's password, else the longest run of 8+ token
# characters that is not a name.
RIPSECRETS_REPO = "sirwart/ripsecrets"
# ripsecrets' own format regexes (``src/find_secrets.rs``), with the length of the literal each
# value starts with (0 when under 3 characters or context, not part of the value: Twilio's
# ``AC``/``SK``, Mailchimp's suffix, npm's ``_authToken=``, Azure's ``AccountKey=``) and the
# group that is the value.
RIPSECRETS_FORMATS: tuple[tuple[str, int, int], ...] = (
    (r"(?:r|s)k_live_[0-9a-zA-Z]{24}", 8, 0),
    (r"(?:AC[a-z0-9]{32}|SK[a-z0-9]{32})", 0, 0),
    (r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}", 4, 0),
    (r"(?:^|\W)(eyJ[A-Za-z0-9-_=]+\.[A-Za-z0-9-_=]+\.?[A-Za-z0-9-_.+/=]*)", 3, 1),
    (r"xox(?:a|b|p|o|s|r)-(?:\d+-)+[a-z0-9]+", 5, 0),
    (r"https://hooks\.slack\.com/services/T[a-zA-Z0-9_]+/B[a-zA-Z0-9_]+/[a-zA-Z0-9_]+", 34, 0),
    (r"//.+/:_authToken=([A-Za-z0-9-_]+)", 0, 1),
    (r"npm_[A-Za-z0-9]{36}", 4, 0),
    (r"AccountKey=([a-zA-Z0-9+/=]{88})", 0, 1),
    (r"SG\.[a-zA-Z0-9_-]{22}\.[a-zA-Z0-9_-]{43}", 3, 0),
    (r"[0-9a-z]{32}-us[0-9]{1,2}", 0, 0),
    (r"sq0csp-[0-9A-Za-z\\\-_]{43}", 7, 0),
    (r"AIzaSy[A-Za-z0-9-_]{33}", 6, 0),
)  # fmt: skip
# Any other value is prefixed when it starts with a documented literal of 3+ characters that the
# other sources' lists already name.
_KNOWN_PREFIXES = (
    *(p for p in (*SECRETLINT_PREFIXES, *VELES_PREFIXES, *DETECTSECRETS_PREFIXES) if len(p) >= 3),
    "AGE-SECRET-KEY-1",
)
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/=_.~-]{8,}")


def ripsecrets_value(line: str) -> tuple[str, str]:
    """The secret a ripsecrets test line holds and the literal it starts with (see above)."""
    for pattern, literal, group in RIPSECRETS_FORMATS:
        m = re.search(pattern, line)
        if m:
            value = m.group(group)
            return value, value[:literal] if literal >= 3 else ""
    m = _URL_PASSWORD.search(line)
    if m:
        return m.group(2), ""
    runs = sorted((r for r in _TOKEN_RUN.findall(line) if not _NAME.match(r)), key=len)
    value = runs[-1] if runs else ""
    return value, next((p for p in _KNOWN_PREFIXES if value.startswith(p)), "")


# Files whose one secret is no credential by the rules of the other sources (an AWS access
# key id).
RIPSECRETS_NOT_SECRET = frozenset({"test/one_per_file/aws_json"})


def build_ripsecrets() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[str] = set()
    for copy in copied_cases("ripsecrets-tests"):
        if copy["path"] in RIPSECRETS_NOT_SECRET:
            dropped["not-a-secret"] += 1
            continue
        for line in copy["text"].splitlines():
            if not line.strip():
                continue
            value, prefix = ripsecrets_value(line)
            if line in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(line)
            if keep(value, dropped):
                case = {"path": copy["path"], "commit": copy["commit"], "input": line}
                row = wanted_row(
                    "ripsecrets", "rs." + copy["path"].rsplit("/", 1)[-1], case, value, ()
                )
                row["how"], row["prefix"] = "format" if prefix else "run", prefix
                rows.append(row)
    return rows, dropped


def fetch_whole(repo: str, name: str) -> None:
    """Download each file copied whole into ``<name>.jsonl`` at its commit and check the copy is
    the file (ripsecrets', trivy's)."""
    copies = copied_cases(name)
    texts = fetched_texts(repo, copies)
    for copy in copies:
        assert texts[(copy["path"], copy["commit"])] == copy["text"], copy["path"]


# trivy (the eleventh source, HELD OUT, ninth round): the data files of aquasecurity/trivy's
# secret scanner tests (``pkg/fanal/secret/testdata/``: every file but the scanner configs, the
# ``.yaml`` files other than ``symfony-secret.yaml``, and ``invalid-utf8.txt``), copied whole into
# ``trivy-tests.jsonl`` (path, commit, text), and every expected finding of its
# ``scanner_test.go`` (``types.SecretFinding``: rule id, lines, ``Match``) into
# ``trivy-findings.jsonl``. trivy masks exactly the secret in ``Match`` with ``*``, so the values
# are found by a rule fixed before the copy was measured (``trivy_cases``): each finding's
# ``Match`` read as a pattern (its ``*`` runs are the secret, as many characters as stars, the
# rest literal) and searched in every line of every copied file; each line it matches is a case,
# the line as trivy's authors wrote it, and each starred span a value. Findings of the test
# configs' own rules (``rule1``, ``multi-line-secret``) are no builtin detector's and are left
# out; so are the rules that find ids or public values.
TRIVY_REPO = "aquasecurity/trivy"
TRIVY_CUSTOM_RULES = frozenset({"rule1", "multi-line-secret"})
TRIVY_NOT_SECRET = frozenset(
    {"aws-access-key-id", "aws-account-id", "alibaba-access-key-id", "stripe-publishable-token"}
)


def trivy_pattern(match: str) -> re.Pattern[str] | None:
    """A ``Match`` as a pattern: each run of ``*`` a group of that many characters, the rest
    literal; None when it has under 4 literal characters (it would match any line)."""
    parts = re.findall(r"\*+|[^*]+", match)
    if sum(len(p) for p in parts if p[0] != "*") < 4:
        return None
    return re.compile("".join(f"(.{{{len(p)}}})" if p[0] == "*" else re.escape(p) for p in parts))


def build_trivy() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    copies = copied_cases("trivy-tests")
    for finding in copied_cases("trivy-findings"):
        rule = finding["rule_id"]
        if rule in TRIVY_CUSTOM_RULES:
            dropped["custom-rule"] += 1
            continue
        if rule in TRIVY_NOT_SECRET:
            dropped["not-a-secret"] += 1
            continue
        pattern = trivy_pattern(finding["match"])
        found = [
            (copy, line, m)
            for copy in copies
            for line in copy["text"].splitlines()
            if pattern is not None and (m := pattern.search(line))
        ]
        if not found:
            dropped["not-found"] += 1  # a match across lines (private keys) or of another copy
            continue
        for copy, line, m in found:
            for value in m.groups():
                if (rule, line + value) in seen:
                    dropped["duplicate"] += 1
                    continue
                seen.add((rule, line + value))
                if keep(value, dropped):
                    case = {"path": copy["path"], "commit": copy["commit"], "input": line}
                    row = wanted_row("trivy", "trivy." + rule, case, value, _KNOWN_PREFIXES)
                    row["how"] = "match"
                    rows.append(row)
    return rows, dropped


# kics (the twelfth source, HELD OUT, tenth round): the positive test files of Checkmarx/kics'
# "Passwords And Secrets" query (``assets/queries/common/passwords_and_secrets/test/positive*``:
# Terraform, YAML, JSON, Dockerfile), its ``positive_expected_result.json`` (each finding's rule
# name, file and line) and the query's ``regex_rules.json``, copied whole into
# ``kics-tests.jsonl`` (path, commit, text) after the detector was frozen. The values are found by
# rules fixed before the copies were read (``kics_hits``, ``kics_aligned``): each finding's
# rule's own regex from the copied ``regex_rules.json`` is searched in the file (per line, or over
# the whole text for a rule with ``multiline.detectLineGroup``, whose group's line is the hit's),
# the value being the group ``_group`` picks (as for the rule-file sources) or a URL's password
# for "Password in URL". The copied test files are later versions than the expected results
# (lines were added above the secrets), so a finding takes the first hit of its rule at or after
# its recorded line; a rule the copied rule file lacks is read by the heuristic (the longest 16+
# character run that is no name) at its line moved by the file's shift. The case's text is that
# line as the test file has it (its number in ``line``; ``kics-tests.jsonl`` keeps the whole
# file, for the whole-file figure). Left out, by reason: ``not-a-secret`` (an AWS access key id,
# a Google OAuth client id, a PuTTY header, a certificate), ``multi-line`` (a private key's
# body), ``line-mismatch`` (no hit of the rule at or after the recorded line), and the drop rules
# every source shares.
KICS_REPO = "Checkmarx/kics"
KICS_DIR = "assets/queries/common/passwords_and_secrets/"
KICS_NOT_SECRET = frozenset(
    {
        "AWS Access Key",
        "Google OAuth",
        "Putty Private Key",
        "Putty User Key File Content",
        "AWS Certificate",
    }
)
KICS_MULTI_LINE = frozenset({"Asymmetric private key"})
_ANY_LINES = "((.*)\\s*)*"


def kics_hits(rule: dict[str, Any], text: str) -> list[tuple[int, str]]:
    """Every (line, value) the rule finds in ``text``: its regex per line, or over the whole
    text for a rule with ``multiline.detectLineGroup`` (the line is its group's), the value the
    group ``_group`` picks (a URL's password for "Password in URL")."""
    pattern = rule["regex"]
    group = (rule.get("multiline") or {}).get("detectLineGroup")
    if group and _ANY_LINES in pattern:
        # RE2 runs ``((.*)\s*)*`` in linear time, Python's backtracking ``re`` never ends on it:
        # the head up to its last use (``apiVersion ... env:``: "inside a manifest") is dropped
        # and the group renumbered in what is left
        head, pattern = pattern.rsplit(_ANY_LINES, 1)
        group -= re.compile(head + _ANY_LINES).groups
    hits: list[tuple[int, str]] = []
    if group:
        for spans in re.finditer(pattern, text):
            if spans.group(group):
                at = text.count("\n", 0, spans.start(group)) + 1
                hits.append((at, spans.group(group).strip().strip("\"'")))
        return hits
    for at, line in enumerate(text.splitlines(), 1):
        m = re.search(pattern, line)
        if m is None:
            continue
        if rule["name"] == "Password in URL":
            url = _URL_PASSWORD.search(m.group(0))
            hits.append((at, url.group(2) if url else ""))
        else:
            hits.append((at, _group(rule["name"], m)))
    return hits


def kics_aligned(
    findings: list[dict[str, Any]], rules: dict[str, dict[str, Any]], text: str
) -> list[tuple[dict[str, Any], int, str | None, str]]:
    """Each finding of one file with the line it is at in the stored copy, its value and how it
    was found. The copies are later versions than the expected results (lines were added above
    the secrets), so a finding whose rule the copied rule file has takes the first hit of that
    rule at or after its recorded line not taken by an earlier finding (``line-mismatch`` when
    there is none); a finding of a rule the rule file lacks is read at its line moved by the
    shift of the file's last aligned finding above it, by the heuristic (``extract``)."""
    out: list[tuple[dict[str, Any], int, str | None, str]] = []
    shifts: list[tuple[int, int]] = []
    lines = text.splitlines()
    names = {f["queryName"] for f in findings} & rules.keys()
    hits = {name: kics_hits(rules[name], text) for name in names}
    for f in sorted(findings, key=lambda f: (f["queryName"] not in rules, f["line"])):
        if f["queryName"] in hits:
            taken = {at for g, at, _, _ in out if g["queryName"] == f["queryName"]}
            hit = next(
                ((a, v) for a, v in hits[f["queryName"]] if a >= f["line"] and a not in taken),
                None,
            )
            if hit is None:
                out.append((f, f["line"], None, "line-mismatch"))
            else:
                shifts.append((f["line"], hit[0] - f["line"]))
                out.append((f, hit[0], hit[1], "capture"))
            continue
        shift = max((s for at, s in shifts if at <= f["line"]), default=0)
        at = f["line"] + shift
        if not 1 <= at <= len(lines):
            out.append((f, at, None, "line-mismatch"))
            continue
        value, how = extract("", None, lines[at - 1])
        out.append((f, at, value, how))
    return out


def build_kics() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str, str]] = set()
    copies = {c["path"]: c for c in copied_cases("kics-tests")}
    rules = {
        "Passwords And Secrets - " + r["name"]: r
        for r in json.loads(copies[KICS_DIR + "regex_rules.json"]["text"])
    }
    by_file: dict[str, list[dict[str, Any]]] = {}
    for finding in json.loads(copies[KICS_DIR + "test/positive_expected_result.json"]["text"]):
        name = finding["queryName"].removeprefix("Passwords And Secrets - ")
        if KICS_DIR + "test/" + finding["fileName"] not in copies:
            dropped["file-not-copied"] += 1
        elif name in KICS_NOT_SECRET:
            dropped["not-a-secret"] += 1
        elif name in KICS_MULTI_LINE:
            dropped["multi-line"] += 1
        else:
            by_file.setdefault(KICS_DIR + "test/" + finding["fileName"], []).append(finding)
    for path, findings in by_file.items():
        copy = copies[path]
        lines = copy["text"].splitlines()
        for finding, at, value, how in kics_aligned(findings, rules, copy["text"]):
            name = finding["queryName"].removeprefix("Passwords And Secrets - ")
            if how == "line-mismatch":
                dropped["line-mismatch"] += 1
                continue
            line = lines[at - 1]
            if (name, line, value or "") in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((name, line, value or ""))
            if value and value not in line:  # a multi-line rule's group spans lines
                dropped["multi-line"] += 1
            elif keep(value or "", dropped):
                case = {"path": path, "commit": copy["commit"], "input": line.strip()}
                row = wanted_row("kics", "kics." + name, case, value or "", _KNOWN_PREFIXES)
                row["how"], row["line"] = how, at
                rows.append(row)
    return rows, dropped


def fetch(source: str) -> None:
    """Download each listed file at its commit and write the trimmed copy again."""
    import yaml

    doc = rule_files(source)
    for f in doc["files"]:
        url = f"https://raw.githubusercontent.com/{doc['repo']}/{f['commit']}/{f['path']}"
        with urllib.request.urlopen(url, timeout=30) as response:
            full = yaml.safe_load(response.read().decode("utf-8"))
        keep = ("name", "id", "categories", "visible", "pattern", "examples")
        f["rules"] = [{k: r[k] for k in keep if k in r} for r in full.get("rules", ())]
    if (HERE / f"{source}-rules.json").exists():
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        (HERE / f"{source}-rules.json").write_text(text, encoding="utf-8")
    else:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        (HERE / f"{source}-rules.yml").write_text(text, encoding="utf-8")


# trufflehog (issue 27's eleventh round, held out): the pattern tests of
# trufflesecurity/trufflehog's detectors (``pkg/detectors/<name>/<name>_test.go``, the first 25
# packages in path order that have one). Its licence is AGPL-3.0, so its test strings are not
# stored in this repository (``.gitignore``): ``build trufflehog`` and ``fetch trufflehog`` run
# on a local copy only, and only the measured figures are kept (``trufflehog.measured.json``).
# Each case whose ``want`` is not empty was copied by hand into ``trufflehog-tests.jsonl``: its
# input as the test builds it (``fmt.Sprintf`` and constants evaluated), each wanted string, and
# for each the literal the detector's regular expression (``<name>.go``) requires at the start of
# the captured value (``prefix``; empty when it starts with a class or alternatives), read from
# the regex by the copier, not chosen here. A wanted string the detector builds from parts
# (``id:secret``) is not in its input and is dropped.
TRUFFLEHOG_REPO = "trufflesecurity/trufflehog"
# detectors whose wanted strings begin with identifiers the test compares with the secret
# (Snowflake: the account and the user name, then the password): those are not secrets
TRUFFLEHOG_IDENTIFIERS = {"trufflehog.snowflake": 2}


def build_trufflehog(source: str = "trufflehog") -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str, str]] = set()
    for case in copied_cases(f"{source}-tests"):
        rule = "trufflehog." + case["path"].removeprefix("pkg/detectors/").split("/", 1)[0]
        for n, (value, prefix) in enumerate(zip(case["want"], case["prefix"], strict=True)):
            if n < TRUFFLEHOG_IDENTIFIERS.get(rule, 0):
                dropped["identifier"] += 1
                continue
            if (rule, case["input"], value) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((rule, case["input"], value))
            if value not in case["input"]:  # built by the detector from parts
                dropped["not-in-input"] += 1
            elif keep(value, dropped):
                prefixes = (prefix,) if len(prefix) >= 3 else ()
                rows.append(wanted_row(source, rule, case, value, prefixes))
    return rows, dropped


def fetch_trufflehog(source: str = "trufflehog") -> None:
    """Download each test file at its commit and check that each stored case's name and each
    wanted value (or the constant it was formatted from) is in it."""
    cases = copied_cases(f"{source}-tests")
    texts = fetched_texts(TRUFFLEHOG_REPO, cases)
    for case in cases:
        text = texts[(case["path"], case["commit"])]
        assert case["test"].split("/")[-1].split(" - ")[0][:20] in text, case["test"]
        for value in case["want"]:
            assert value[:16] in text or value[-16:] in text, (case["path"], value)


# semgrep (issue 27's thirteenth round, held out): the tests of semgrep/semgrep-rules'
# secrets rules (``generic/secrets/security`` and ``generic/secrets/gitleaks``: each rule's
# test file, a line after a ``ruleid:`` comment must match), copied by a helper session into
# ``semgrep-tests.jsonl`` (each annotated line, the lines around it, and the value the rule's
# regex matches in it, run with Python's ``re``). Its licence (LGPL-2.1 with the Commons
# Clause) keeps its text out of this repository (``.gitignore``); only the figures are kept
# (``semgrep.measured.json``). The value a case is about, decided before measuring: the
# copier's token (``secret_alt``) or else the regex's group, then the value of a ``key=value``
# or ``key: value`` it holds, the password of a URL's credentials, a secret URL parameter's
# value; password hashes (bcrypt, /etc/shadow), a PEM header line and a key file's ``type``
# are no credential values and are dropped, as are values not in the case's lines.
SEMGREP_NOT_CREDENTIALS = ("detected-bcrypt-hash", "detected-etc-shadow")
_SEMGREP_KEY_VALUE = re.compile(
    r"""^["']?[A-Za-z_][\w.\-]*["']?\s*(?:=|:|::=|=>|">)\s*["']?(?P<v>[^\s"'=][^\s"']*)["']?$"""
)
_SEMGREP_URL_PASSWORD = re.compile(r"://[^:/@\s]+:(?P<v>[^@\s]+)@")
_SEMGREP_URL_PARAM = re.compile(r"[?&](?:[\w-]*(?:secret|token|key|password))=(?P<v>[^&\s]+)", re.I)


def _semgrep_value(case: dict[str, Any]) -> str:
    value = str(case.get("secret_alt") or case.get("secret") or "")
    for shape in (_SEMGREP_URL_PASSWORD, _SEMGREP_URL_PARAM, _SEMGREP_KEY_VALUE):
        m = shape.search(value)
        if m and len(m.group("v")) >= 8:
            return m.group("v")
    return value


def build_semgrep(source: str = "semgrep") -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str, str]] = set()
    for case in copied_cases(f"{source}-tests"):
        if case["expect"] != "ruleid":
            continue
        rule = "semgrep." + case["rule"]
        value = _semgrep_value(case)
        example = case["context"]
        if case["rule"] in SEMGREP_NOT_CREDENTIALS:
            dropped["not-a-credential"] += 1
        elif value.startswith("-----") or value.startswith('"type"'):
            dropped["a header, not the value"] += 1
        elif not value or value not in example:
            dropped["no value in the lines"] += 1
        elif (rule, example, value) in seen:
            dropped["duplicate"] += 1
        elif keep(value, dropped):
            seen.add((rule, example, value))
            prefix = str(case.get("prefix_alt") or case.get("prefix") or "")
            row = {
                "source": source,
                "rule": rule,
                "name": case["rule"],
                "example": example,
                "secret": value,
                "how": "ruleid",
                "prefix": prefix if len(prefix) >= 3 and value.startswith(prefix) else "",
                "file": case["path"],
                "commit": case["commit"],
            }
            rows.append(row)
    return rows, dropped


# leaktk (issue 27's fourteenth round, HELD OUT): the expected findings of leaktk's own scanner
# tests (leaktk/patterns, MIT; ``testdata/leaktk-scanner-results.yaml``: for each finding over
# leaktk/fake-leaks' files, its rule's description, the file, the text the rule matched and the
# secret it reports), copied by hand into ``leaktk-tests.jsonl`` (one line a finding: ``rule``,
# ``location``, ``match``, ``secret``, as YAML reads them; the file's ``rule.id`` hashes are not
# copied). The case is the ``match`` text with the reported ``secret``; no value is chosen here.
# Rules fixed before the copy was measured: findings under ``semgrep-rules-examples/`` (copies of
# semgrep-rules' tests, a source measured and tuned on in the thirteenth round) and findings whose
# secret spans lines or is over 300 characters (private keys, base64-encoded files, container
# registry ``auths`` blocks, two JWTs of 430 and 560 characters) were not copied
# (``LEAKTK_NOT_COPIED``); an AWS key id, password hashes and a file-name finding are no
# credential; a case with the same text and value as an earlier one is a duplicate; a value
# that is already a secret of another stored corpus is left out (``seen-in-another-source``:
# those were looked at or tuned on); then the shared drop rules (``keep``). A value is
# *prefixed* when it starts with the literal its rule's format documents
# (``LEAKTK_PREFIXES``, by rule description; the generic rules have none).
LEAKTK_REPO = "leaktk/patterns"
LEAKTK_NOT_COPIED = {"semgrep-rules-examples (another source)": 30, "multi-line or over 300": 15}
LEAKTK_NOT_SECRET = frozenset(
    {"AWS IAM Unique Identifier", "Password Hash", "Htpasswd File", "PKCS #12 File"}
)
LEAKTK_PREFIXES: dict[str, tuple[str, ...]] = {
    "ArgoCD JWT": ("eyJ",),
    "Auth0 JWT": ("eyJ",),
    "Kubernetes System Service Account JWT": ("eyJ",),
    "Dropbox Short-Lived Access Token": ("sl.",),
    "Dropbox Short-Lived Offline Access Token": ("sl.u.",),
    "Dynatrace Token": ("dt0",),
    "GitHub Fine-Grained Personal Access Token": ("github_pat_",),
    "GitHub OAuth Access Token": ("gho_",),
    "GitHub Personal Access Token": ("ghp_",),
    "GitHub Refresh Token": ("ghr_",),
    "GitHub Server to Server Token": ("ghs_",),
    "GitHub User to Server Token": ("ghu_",),
    "GitLab Access Token": ("glpat-",),
    "GitLab Pipeline Trigger Token": ("glptt-",),
    "GitLab Runner Registration Token": ("GR1348941", "glrt-"),
    "Google Cloud Platform API Key": ("AIza",),
    "Groq API Key": ("gsk_",),
    "Hugging Face API Token": ("hf_",),
    "Mailgun API Key": ("key-",),
    "NPM Access Token": ("npm_",),
    "OpenAI API Key": ("sk-proj-", "sk-svcacct-", "sk-"),
    "OpenShift Login Token": ("sha256~",),
    "PyPI Upload Token": ("pypi-",),
    "Picatic API Key": ("sk_live_",),
    "SendGrid API Key": ("SG.",),
    "Shopify Access Token": ("shpat_",),
    "Shopify Custom App Access Token": ("shpca_",),
    "Shopify Private App Access Token": ("shppa_",),
    "Shopify Shared Secret": ("shpss_",),
    "Slack App Token": ("xapp-",),
}


def other_sources_secrets(source: str) -> set[str]:
    """Every secret of the other stored corpora (``<name>.jsonl`` beside this file)."""
    seen: set[str] = set()
    for path in HERE.glob("*.jsonl"):
        if path.stem.startswith(source) or path.stem.endswith(("-tests", "-snapshots")):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if isinstance(row.get("secret"), str):
                seen.add(row["secret"])
    return seen


def build_leaktk() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter(LEAKTK_NOT_COPIED)
    elsewhere = other_sources_secrets("leaktk")
    seen: set[tuple[str, str]] = set()
    for case in copied_cases("leaktk-tests"):
        value, example = case["secret"], case["match"]
        if case["rule"] in LEAKTK_NOT_SECRET:
            dropped["not-a-secret"] += 1
            continue
        if (example, value) in seen:
            dropped["duplicate"] += 1
            continue
        seen.add((example, value))
        if value and value in elsewhere:
            dropped["seen-in-another-source"] += 1
        elif value and value not in example:
            dropped["not-in-input"] += 1
        elif keep(value, dropped):
            prefixes = LEAKTK_PREFIXES.get(case["rule"], ())
            copy = {**case, "input": example, "test": case["rule"]}
            row = wanted_row("leaktk", "leaktk." + case["rule"], copy, value, prefixes)
            row["location"] = case["location"]
            rows.append(row)
    return rows, dropped


def fetch_leaktk() -> None:
    """Download the results file at its commit and check each copied finding is in it."""
    cases = copied_cases("leaktk-tests")
    text = next(iter(fetched_texts(LEAKTK_REPO, cases[:1]).values()))
    for case in cases:
        assert case["location"] in text, case["location"]
        assert case["secret"][:24] in text, (case["location"], case["secret"])


# leaky-repo (HELD OUT, sixteenth round): Plazmaz/leaky-repo, a repository of planted secrets made
# as a benchmark for secret scanners (MIT), and the provider files its fork
# khulnasoft-lab/leaky-repo adds (from aquasecurity/leaky-repo). Each line of a file that plants
# a value (Plazmaz's ``.leaky-meta/secrets.csv`` names the risk and informative lines of each
# file; the fork's files are one provider each, every literal assigned in them its secret) was
# copied by hand into ``leakyrepo-tests.jsonl`` with the value it holds (``want``: the assigned
# value, quotes stripped; a URL's password; the file itself for ``master.key``). Fixed before
# measuring: what the source marks informative (an S3 access key under ``access_key``, a
# ``client_key``, the two ``high-entropy-misc.txt`` strings), key ids and key names (AWS, Spaces,
# Confluent, Coinbase legacy, Sumo Logic, a Coinbase CDP key name), user names (Firefox's
# ``encryptedUsername``, a Gmail address) and password hashes (bcrypt, crypt, htpasswd) are no
# credential; then duplicates, values another stored corpus holds, and the shared drop rules.
LEAKYREPO_REPOS = ("Plazmaz/leaky-repo", "khulnasoft-lab/leaky-repo")
LEAKYREPO_NOT_SECRET = frozenset({"KeyID", "KeyName", "Username", "Informative", "Hash"})
LEAKYREPO_NOT_COPIED = {"multi-line private keys (id_rsa, cert-key.pem, putty ppk)": 3}
# Documented literals of the formats the kept values have (3+ characters).
LEAKYREPO_PREFIXES = (
    "xoxp-", "sq0atp-", "aio_", "dnkey-", "doo_v1_", "dor_v1_", "dop_v1_", "nfp_", "rdme_",
    "hvb.", "hvs.", "sc_", "dict.1.1.", "-----BEGIN EC PRIVATE KEY-----",
)  # fmt: skip
_AIRTABLE_PAT = re.compile(r"^pat[A-Za-z0-9]{14}\.[a-f0-9]{64}$")


def leakyrepo_prefix(value: str) -> str:
    if _AIRTABLE_PAT.match(value):
        return "pat"
    return next((p for p in LEAKYREPO_PREFIXES if value.startswith(p)), "")


def build_leakyrepo() -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter(LEAKYREPO_NOT_COPIED)
    elsewhere = other_sources_secrets("leakyrepo")
    seen: set[tuple[str, str]] = set()
    for case in copied_cases("leakyrepo-tests"):
        for field, value in case["want"].items():
            if field in LEAKYREPO_NOT_SECRET:
                dropped["not-a-secret"] += 1
                continue
            if (case["input"], value) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((case["input"], value))
            if value in elsewhere:
                dropped["seen-in-another-source"] += 1
            elif keep(value, dropped):
                copy = {**case, "test": field}
                row = wanted_row("leakyrepo", "leakyrepo." + case["path"], copy, value, ())
                row["prefix"], row["repo"] = leakyrepo_prefix(value), case["repo"]
                rows.append(row)
    return rows, dropped


def fetch_leakyrepo() -> None:
    """Download each file the copied lines name at its commit and check each line is in it."""
    for repo in LEAKYREPO_REPOS:
        cases = [c for c in copied_cases("leakyrepo-tests") if c["repo"] == repo]
        texts = fetched_texts(repo, cases)
        for case in cases:
            assert case["input"] in texts[(case["path"], case["commit"])], case["path"]


# sarif-pattern-matcher (HELD OUT, seventeenth round): the inputs of the secret rules' tests of
# microsoft/sarif-pattern-matcher (MIT; ``Src/Plugins/Tests.Security/TestData/
# SecurePlaintextSecrets/Inputs/*``, Microsoft's SEC101 "DoNotExposePlaintextSecrets" rules:
# HTTP auth headers, Google, Facebook, Slack, GitHub, AWS, Square, Akamai, Stripe, npm, Twilio,
# Dropbox, Mailgun, Alibaba, HockeyApp, NuGet, MongoDB, Cloudant, MySQL, SQL Server, PostgreSQL,
# RabbitMQ, Shopify, Postman, crates.io, PSCredential and SqlCredential objects, GPG passphrases,
# ConvertTo-SecureString, cmdkey, UserPasswordCredential, Azure DevOps PATs). Each line of an
# input file that plants a value was copied by hand into ``sarifpm-tests.jsonl`` with the value
# it holds (``want``: the assigned or passed value, quotes stripped; the whole URL for a Slack
# webhook); an element whose value sits on its own line is copied with its tags. Fixed before
# measuring: client ids, app ids, key ids and user names are no credential; values the source's
# own comments say must not be found (``SourceNegative``: "should be ignored, since is
# localhost", "invalid password example", "This should be missed", the ``NoMatch`` patterns) and
# values the source's text shows as placeholders (``your-password``, ``{your_password_2}``) are
# left out; a value that is one unit of up to 8 characters repeated over its whole length
# (``deadbeefdeadbeef...``) is a placeholder; then duplicates (same line, same value), values
# another stored corpus holds, and the shared drop rules. Not copied: files whose lines repeat a
# copied file's (older or renamed copies), the two multi-line private-key files, a file with no
# value; in the copied files, about 60 lines repeating a copied line's shape whose value the
# shared rules drop (short, ``password``, ``<password>``, ``{4444}``, repeated digits) and the
# source's non-matches (commit hashes in GitHub URLs, a CamelCase name).
SARIFPM_REPO = "microsoft/sarif-pattern-matcher"
SARIFPM_NOT_SECRET = frozenset(
    {"ClientID", "AppID", "KeyID", "Username", "NoMatch", "SourceNegative", "Placeholder"}
)
SARIFPM_NOT_COPIED = {
    "files repeating a copied file (older or renamed copies)": 12,
    "multi-line private-key files (SEC101_013)": 2,
    "a file with no value (SEC101_015.GoogleGCMServiceAccount)": 1,
}
# Documented literals of the formats the kept values have (3+ characters).
SARIFPM_PREFIXES = (
    "xoxb-", "sq0csp-", "EAACEdEose0cBA", "EAAA", "AIza", "sk_live_", "rk_live_", "npm_", "oy2",
    "PMAK-", "cio", "shpat_", "shpca_", "shppa_", "ghp_", "ghr_", "akab-",
    "https://hooks.slack.com/services/",
)  # fmt: skip
_PERIODIC = re.compile(r"^(.{1,8}?)\1{2,}$")


def copied_rows(
    source: str,
    not_secret: Mapping[str, str],
    not_copied: Mapping[str, int],
    name_of: Callable[[dict[str, Any]], str],
    prefixes: tuple[str, ...],
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The rows of a source copied by hand line by line (``<source>-tests.jsonl``: each line's
    ``want``, field -> value), by the drop rules every such source shares: a field of
    ``not_secret`` is dropped under the reason it names, then duplicates (same line, same
    value), values another stored corpus holds, periodic placeholders and the shared rules
    (``keep``); each row's rule is ``<source>.<name_of(case)>``."""
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter(not_copied)
    elsewhere = other_sources_secrets(source)
    seen: set[tuple[str, str]] = set()
    for case in copied_cases(f"{source}-tests"):
        for field, value in case["want"].items():
            if field in not_secret:
                dropped[not_secret[field]] += 1
                continue
            if (case["input"], value) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((case["input"], value))
            if value in elsewhere:
                dropped["seen-in-another-source"] += 1
            elif _PERIODIC.match(value):
                dropped["placeholder"] += 1
            elif keep(value, dropped):
                copy = {**case, "test": field}
                rows.append(wanted_row(source, f"{source}.{name_of(copy)}", copy, value, prefixes))
    return rows, dropped


def not_secret_reasons(fields: Iterable[str], **special: str) -> dict[str, str]:
    """Each field that holds no credential -> the reason it is dropped under: ``not-a-secret``,
    or the one ``special`` names for it (a value the source itself says is no secret)."""
    return {f: special.get(f, "not-a-secret") for f in fields}


def build_sarifpm() -> tuple[list[dict[str, Any]], Counter[str]]:
    return copied_rows(
        "sarifpm",
        not_secret_reasons(
            SARIFPM_NOT_SECRET,
            SourceNegative="source-negative-or-placeholder",
            Placeholder="source-negative-or-placeholder",
        ),
        SARIFPM_NOT_COPIED,
        lambda case: case["path"].rsplit("/", 1)[-1],
        SARIFPM_PREFIXES,
    )


# checkov (HELD OUT, eighteenth round): the secret fixtures of bridgecrewio/checkov's secret
# scanner tests (Apache-2.0; ``tests/secrets/**``: AWS keys in CloudFormation, Python,
# TypeScript and Dockerfiles, passwords in JSON and JavaScript, a MongoDB URL, Kubernetes-style
# ``name``/``value`` pairs in YAML, Terraform (``jsonencode``, ``kubernetes_pod`` env blocks, a
# CloudFormation heredoc) and JSON, a docker-compose environment of pomerium, custom-regex
# fixtures, a user_data script embedded in a JSON report). Each line that plants a value was
# copied by hand into ``checkov-tests.jsonl`` with the value it holds (``want``); where the name
# that says what a value is sits on other lines of the same element (``name: TEST_PASSWORD_3``
# then ``value: ...``), the element's lines from the name to the value are the input. Fixed
# before measuring: AWS access key ids (also one under ``AWS_SECRET_ACCESS_KEY``: the source
# swaps the names), user names and client ids are no credential; the value under
# ``TEST_PASSWORD_no_password`` is one the source's own name says is not a password
# (``SourceNegative``); a value that is one unit of up to 8 characters repeated is a placeholder;
# then duplicates (same line, same value), values another stored
# corpus holds and the shared drop rules. Not copied: values over 300 characters (as for
# leaktk), multi-line keys and multi-line placeholders; not read: the other key-file fixtures
# (``build_log_with_private_key.log``, ``bracket_log_with_private_key.log``,
# ``build_log_with_putty_key.log``, ``plain_private_key.txt``), the git-history pickles and
# objects, and the false-positive fixtures (``sanity/*_fp``, ``secret-no-false-positive*``).
CHECKOV_REPO = "bridgecrewio/checkov"
CHECKOV_NOT_SECRET = frozenset({"KeyID", "Username", "ClientID", "SourceNegative"})
CHECKOV_NOT_COPIED = {
    "values over 300 characters (TEST_PASSWORD_LONG_1 in 5 files; pomerium's PEM key, base64 "
    "key, base64 service account and base64 signing key; a repeated custom-regex value)": 10,
    "a multi-line private key (build_log_with_mixed_secrets.log)": 1,
    "multi-line placeholder findings (multiline_finding/Dockerfile.two_secrets)": 2,
}
# Documented literals of the formats the kept values have (3+ characters).
CHECKOV_PREFIXES = ("ghp_", "rk_live_")


def build_checkov() -> tuple[list[dict[str, Any]], Counter[str]]:
    return copied_rows(
        "checkov",
        not_secret_reasons(CHECKOV_NOT_SECRET, SourceNegative="source-negative"),
        CHECKOV_NOT_COPIED,
        lambda case: case["path"].removeprefix("tests/secrets/"),
        CHECKOV_PREFIXES,
    )


# horusec and gosec (HELD OUT, nineteenth round): two static analysers' own samples of leaked
# credentials, both Apache-2.0. horusec: the vulnerable samples of ZupIT/horusec's leaks engine
# (``internal/services/engines/leaks/samples.go``, rules HS-LEAKS-1 .. HS-LEAKS-28: AWS, MWS,
# Facebook, Twitter, GitHub, LinkedIn, Slack, GCP, Heroku, Mailchimp, Mailgun, PayPal/Braintree,
# Picatic, SendGrid, Stripe, Square, Twilio keys in a docker-compose ``environment:`` block, a
# Go gorm DSN and URL, WordPress ``define``s). gosec: the positive samples of securego/gosec's
# G101 (hard-coded credentials) tests (``testutils/g101_samples.go``: Go declarations,
# assignments and comparisons under credential names, and values by format). Each line that
# plants a value was copied by hand into ``<source>-tests.jsonl`` with the value it holds
# (``want``: the quoted literal as the line has it; for ``Bearer: <token>`` the token, for a
# URL its password). Fixed before measuring: AWS access key ids and client ids (``KeyID``,
# ``ClientID``; Google's ``...apps.googleusercontent.com`` is a client id) are no credential;
# WordPress's own ``put your unique phrase here`` is a placeholder the source names as such
# (``SourcePlaceholder``); then duplicates (same line, same value: gosec tests each line as a
# ``const`` and a ``var``), values another stored corpus holds and the shared drop rules.
# Not copied: horusec's HS-LEAKS-12 private key (one line over 300 characters, with ``...``
# inside); the negative samples (``SampleSafe*``, gosec's samples expecting 0 findings).
HORUSEC_REPO = "ZupIT/horusec"
GOSEC_REPO = "securego/gosec"
COPIED_NOT_SECRET = frozenset({"KeyID", "ClientID", "SourcePlaceholder"})
COPIED_NOT_COPIED: dict[str, dict[str, int]] = {
    "horusec": {"a private key over 300 characters (HS-LEAKS-12)": 1},
    "gosec": {},
}
# Documented literals of the formats the kept values have (3+ characters).
COPIED_PREFIXES: dict[str, tuple[str, ...]] = {
    "horusec": (
        "amzn.mws.", "AIza", "key-", "access_token$production$", "sk_live_", "rk_live_", "SG.",
        "sq0atp-", "sq0csp-", "https://hooks.slack.com/services/",
    ),
    "gosec": ("ghp_", "AIza"),
}  # fmt: skip


def build_copied(source: str) -> tuple[list[dict[str, Any]], Counter[str]]:
    """horusec's and gosec's copied lines: each ``want`` value, by the rules above."""
    return copied_rows(
        source,
        not_secret_reasons(COPIED_NOT_SECRET, SourcePlaceholder="source-placeholder"),
        COPIED_NOT_COPIED[source],
        lambda case: str(case["sample"]),
        COPIED_PREFIXES[source],
    )


def fetch_copied(repo: str, source: str) -> None:
    """Download each file the copied lines name at its commit and check each line is in it
    (sarifpm, checkov, horusec, gosec)."""
    cases = copied_cases(f"{source}-tests")
    texts = fetched_texts(repo, cases)
    for case in cases:
        where = case.get("sample", case["path"])
        assert case["input"] in texts[(case["path"], case["commit"])], where


# source -> (how its rows are built, how its copy is checked against GitHub); the rule-file
# sources (Nosey Parker, the Kingfisher thirds) use ``write`` and ``fetch``.
BUILDERS: dict[str, Callable[[], tuple[list[dict[str, Any]], Counter[str]]]] = {
    "secretlint": build_secretlint,
    "veles": lambda: build_veles("veles"),
    "veles2": lambda: build_veles("veles2"),
    "veles3": lambda: build_veles("veles3"),
    "veles4": lambda: build_veles("veles4"),
    "veles5": lambda: build_veles("veles5"),
    "detectsecrets": build_detectsecrets,
    "whispers": build_whispers,
    "ripsecrets": build_ripsecrets,
    "trivy": build_trivy,
    "kics": build_kics,
    "trufflehog": build_trufflehog,
    "leaktk": build_leaktk,
    "leakyrepo": build_leakyrepo,
    "sarifpm": build_sarifpm,
    "checkov": build_checkov,
    "horusec": partial(build_copied, "horusec"),
    "gosec": partial(build_copied, "gosec"),
}
FETCHERS: dict[str, Callable[[], None]] = {
    "secretlint": fetch_secretlint,
    "veles": lambda: fetch_veles("veles"),
    "veles2": lambda: fetch_veles("veles2"),
    "veles3": lambda: fetch_veles("veles3"),
    "veles4": lambda: fetch_veles("veles4"),
    "veles5": lambda: fetch_veles("veles5"),
    "detectsecrets": lambda: fetch_wanted(DETECTSECRETS_REPO, "detectsecrets"),
    "whispers": lambda: fetch_wanted(WHISPERS_REPO, "whispers"),
    "ripsecrets": lambda: fetch_whole(RIPSECRETS_REPO, "ripsecrets-tests"),
    "trivy": lambda: fetch_whole(TRIVY_REPO, "trivy-tests"),
    "kics": lambda: fetch_whole(KICS_REPO, "kics-tests"),
    "trufflehog": fetch_trufflehog,
    "leaktk": fetch_leaktk,
    "leakyrepo": fetch_leakyrepo,
    "sarifpm": partial(fetch_copied, SARIFPM_REPO, "sarifpm"),
    "checkov": partial(fetch_copied, CHECKOV_REPO, "checkov"),
    "horusec": partial(fetch_copied, HORUSEC_REPO, "horusec"),
    "gosec": partial(fetch_copied, GOSEC_REPO, "gosec"),
}

# trufflehog's later slices (trufflehog2 .. trufflehog11): the same builder and check, by name
TRUFFLEHOG_SLICES = [f"trufflehog{n}" for n in range(2, 12)]
BUILDERS.update({s: partial(build_trufflehog, s) for s in TRUFFLEHOG_SLICES})
BUILDERS["semgrep"] = build_semgrep
FETCHERS.update({s: partial(fetch_trufflehog, s) for s in TRUFFLEHOG_SLICES})


def main(argv: list[str]) -> None:
    if argv[:1] == ["fetch"]:
        for source in argv[1:] or SOURCES:
            FETCHERS.get(source, lambda s=source: fetch(s))()
    elif argv[:1] == ["build"]:
        for source in argv[1:] or SOURCES:
            if source in BUILDERS:
                rows, dropped = BUILDERS[source]()
                write_rows(source, rows, dropped, per_file=source == "detectsecrets")
            elif any((HERE / f"{source}-rules.{ext}").exists() for ext in ("yml", "json")):
                write(source)
    else:
        print(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
