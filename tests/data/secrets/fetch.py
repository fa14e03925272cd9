"""Make the public secret corpora (issue 27) from other scanners' rule files.

Two steps, each runnable alone::

    python tests/data/secrets/fetch.py fetch noseyparker   # needs network and PyYAML
    python tests/data/secrets/fetch.py build                # needs PyYAML only

Sources: ``noseyparker``, ``kingfisher`` (held-out third), ``kingfisher-tuning`` (another third),
``secretlint`` (snapshots, see ``build_secretlint``) and ``veles``, ``veles2``, ``veles3`` (the
detector tests of google/osv-scalibr, see ``build_veles``), ``detectsecrets`` (the plugin tests of
Yelp/detect-secrets, see ``build_detectsecrets``).

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
    "detectsecrets",
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
    return str(rule.get("name", "")).endswith("Client ID")


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


def build(source: str) -> tuple[list[dict[str, Any]], Counter[str]]:
    import yaml  # type: ignore[import-untyped]  # build-time only: the tests read the JSONL

    doc = yaml.safe_load((HERE / f"{source}-rules.yml").read_text(encoding="utf-8"))
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
    import yaml

    doc = yaml.safe_load((HERE / f"{source}-rules.yml").read_text(encoding="utf-8"))
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


def write_secretlint() -> None:
    rows, dropped = build_secretlint()
    with (HERE / "secretlint.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    summary: dict[str, Any] = {"kept": len(rows), "dropped": dict(sorted(dropped.items()))}
    summary["prefixed"] = sum(1 for r in rows if r["prefix"])
    (HERE / "secretlint.dropped.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("secretlint", json.dumps(summary))


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
# Fields of a wanted secret that are no credential: ids and the patterns of a non-credential
# detector (agentsandboxexfil reports exfiltration patterns, not secrets).
VELES_NOT_SECRET = frozenset(
    {"AccessID", "AccessKeyID", "ClientID", "ID", "RoleID", "Username", "Pattern"}
)
# The literal each format starts with (documented token formats; an access id's LTAI is an id).
VELES_PREFIXES = (
    "sk-ant-api", "sk-ant-admin", "CCIPAT_", "CCIPRJ_", "CLOJARS_", "sk-co-",
    # the second slice (veles2)
    "cio", "key_", "dop_v1_", "dckr_pat_", "essu_", "AIza", "ya29.", "GOCSPX-", "glpat-",
    "ATCTT3xFfGN0",
    # the third slice (veles3)
    "xai-", "hf_", "sk-or-v1-", "hvs.", "hvb.", "ops_eyJ", "1PRK-", "A3-", "sk-proj-", "eyJ", "sk-",
)  # fmt: skip


def build_veles(source: str = "veles") -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str, str]] = set()
    for line in (HERE / f"{source}-tests.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
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
            if not value:
                dropped["no-value"] += 1
            elif len(value) < 8:
                dropped["short"] += 1
            elif placeholder(value):
                dropped["placeholder"] += 1
            else:
                prefix = next((p for p in VELES_PREFIXES if value.startswith(p)), "")
                rows.append(
                    {
                        "source": source,
                        "rule": rule,
                        "name": case["test"],
                        "example": case["input"],
                        "secret": value,
                        "how": "wanted",
                        "prefix": prefix,
                        "file": case["path"],
                        "commit": case["commit"],
                    }
                )
    return rows, dropped


def write_veles(source: str = "veles") -> None:
    rows, dropped = build_veles(source)
    with (HERE / f"{source}.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    summary: dict[str, Any] = {"kept": len(rows), "dropped": dict(sorted(dropped.items()))}
    summary["prefixed"] = sum(1 for r in rows if r["prefix"])
    summary["files"] = len({r["file"] for r in rows})
    (HERE / f"{source}.dropped.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(source, json.dumps(summary))


def fetch_veles(source: str = "veles") -> None:
    """Download each test file at its commit and check that the stored case is in it: its test
    name, and each wanted value or the constant it was built from (a check of the copy, not a Go
    evaluator)."""
    texts: dict[tuple[str, str], str] = {}
    for line in (HERE / f"{source}-tests.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        key = (case["path"], case["commit"])
        if key not in texts:
            url = f"https://raw.githubusercontent.com/{VELES_REPO}/{key[1]}/{key[0]}"
            with urllib.request.urlopen(url, timeout=30) as response:
                texts[key] = response.read().decode("utf-8")
        text = texts[key]
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
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for line in (HERE / "detectsecrets-tests.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        stem = case["path"].removeprefix("tests/plugins/").removesuffix("_test.py")
        rule = "ds." + stem
        for field, value in case["want"].items():
            if field in DETECTSECRETS_NOT_SECRET:
                dropped["not-a-secret"] += 1
                continue
            if (case["input"], value) in seen:
                dropped["duplicate"] += 1
                continue
            seen.add((case["input"], value))
            if len(value) < 8:
                dropped["short"] += 1
            elif placeholder(value):
                dropped["placeholder"] += 1
            else:
                prefix = next((p for p in DETECTSECRETS_PREFIXES if value.startswith(p)), "")
                rows.append(
                    {
                        "source": "detectsecrets",
                        "rule": rule,
                        "name": case["test"],
                        "example": case["input"],
                        "secret": value,
                        "how": "wanted",
                        "prefix": prefix,
                        "file": case["path"],
                        "commit": case["commit"],
                    }
                )
    return rows, dropped


def write_detectsecrets() -> None:
    rows, dropped = build_detectsecrets()
    with (HERE / "detectsecrets.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    summary: dict[str, Any] = {"kept": len(rows), "dropped": dict(sorted(dropped.items()))}
    summary["prefixed"] = sum(1 for r in rows if r["prefix"])
    summary["files"] = len({r["file"] for r in rows})
    summary["per_file"] = dict(sorted(Counter(r["file"] for r in rows).items()))
    (HERE / "detectsecrets.dropped.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("detectsecrets", json.dumps(summary))


def fetch_detectsecrets() -> None:
    """Download each test file at its commit and check that each stored value, or the part of
    it the test builds with ``format()``, is in it (a check of the copy, not a Python
    evaluator)."""
    texts: dict[tuple[str, str], str] = {}
    for line in (HERE / "detectsecrets-tests.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        key = (case["path"], case["commit"])
        if key not in texts:
            url = f"https://raw.githubusercontent.com/{DETECTSECRETS_REPO}/{key[1]}/{key[0]}"
            with urllib.request.urlopen(url, timeout=30) as response:
                texts[key] = response.read().decode("utf-8")
        for value in case["want"].values():
            assert value[:24] in texts[key] or value[-24:] in texts[key], (case["path"], value)


def fetch(source: str) -> None:
    """Download each listed file at its commit and write the trimmed copy again."""
    import yaml

    path = HERE / f"{source}-rules.yml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    for f in doc["files"]:
        url = f"https://raw.githubusercontent.com/{doc['repo']}/{f['commit']}/{f['path']}"
        with urllib.request.urlopen(url, timeout=30) as response:
            full = yaml.safe_load(response.read().decode("utf-8"))
        keep = ("name", "id", "categories", "visible", "pattern", "examples")
        f["rules"] = [{k: r[k] for k in keep if k in r} for r in full.get("rules", ())]
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")


def main(argv: list[str]) -> None:
    if argv[:1] == ["fetch"]:
        for source in argv[1:] or SOURCES:
            if source == "secretlint":
                fetch_secretlint()
            elif source in ("veles", "veles2", "veles3"):
                fetch_veles(source)
            elif source == "detectsecrets":
                fetch_detectsecrets()
            else:
                fetch(source)
    elif argv[:1] == ["build"]:
        for source in argv[1:] or SOURCES:
            if source == "secretlint":
                write_secretlint()
            elif source in ("veles", "veles2", "veles3"):
                write_veles(source)
            elif source == "detectsecrets":
                write_detectsecrets()
            elif (HERE / f"{source}-rules.yml").exists():
                write(source)
    else:
        print(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
