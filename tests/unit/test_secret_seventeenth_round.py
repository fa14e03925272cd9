"""Issue 27, seventeenth round: what the held-out sarif-pattern-matcher's misses taught, written
generically (after its single measurement): an element whose value sits on its own line, a
personal access token under an appSettings key, any credential class's constructor, JDBC's
getConnection(url, user, password), a weak password under a connection string's Password key,
PowerShell's ConvertTo-SecureString -AsPlainText, -u user -p password on any command line, a
random token in a <Key> element, and Azure DevOps' 52-character personal access tokens bare.
Each shape's look-alikes are left.

Values are made up here (none is a corpus's).
"""

from __future__ import annotations

import pytest

from schemas.secret_scan import default_detector
from tests.unit.secret_support import TakeCounter

TOKEN = "Qm7vRt2xKp9LwZ4nHs8dFj3c"  # 24 letters and digits, all three classes
HEX40 = "3f9c2a7e81b4d06c5e9f1a2b7c8d4e6f0a1b2c3d"
ADO = "q7mzc3xkp4tvhn2wyr6ejd5abf7gsl3uio2wkq4zxn6cvb5mtr3e"  # 52 of a-z and 2-7

FOUND = [
    # elements whose value is on a line of its own
    (f"<GithubToken>\n\t{HEX40}\n</GithubToken>", HEX40),
    (f"<AppSecret>\r\n    {TOKEN}\r\n</AppSecret>", TOKEN),
    ("<password>\n  Hx9-Lm2!rQ\n</password>", "Hx9-Lm2!rQ"),
    # a personal access token under an appSettings key
    (f'<add key="GitHubPat" value="{HEX40}" />', HEX40),
    (f'<add key="ADO_PAT" value="{ADO}" />', ADO),
    # credential classes by their name, and JDBC's getConnection
    ('new UserPasswordCredential("svc@corp.example", "Wint3r-Is-Here")', "Wint3r-Is-Here"),
    ('new ClientSecretCredential("tenant", "client-id", "Zq8~sEcr3t.Val")', "Zq8~sEcr3t.Val"),
    ('DriverManager.getConnection(url, "app", "Pg_pass_2024x");', "Pg_pass_2024x"),
    # a weak password is still one under a connection string's Password key
    ("Data Source=db01;User ID=sa;Password= b2Cool@@77", "b2Cool@@77"),
    # PowerShell: the plaintext of a SecureString, both argument orders
    ('$pw = ConvertTo-SecureString -String "Summer2024!x" -AsPlainText -Force', "Summer2024!x"),
    ("$pw = ConvertTo-SecureString 'Tr1cky_Pass' -AsPlainText -Force", "Tr1cky_Pass"),
    ('ConvertTo-SecureString -AsPlainText -Force -String "N0t-So-Secret"', "N0t-So-Secret"),
    # -u user -p password on any command
    ("npm login -r https://registry.example -u ci-bot -p cGFzc3dvcmQ5x", "cGFzc3dvcmQ5x"),
    ("some-cli connect -U admin -p 'Hunter2-Prod'", "Hunter2-Prod"),
    # a random token alone in a <Key> element
    (f"<Account>svc-account</Account>\n<Key>{TOKEN}</Key>", TOKEN),
    # an Azure DevOps PAT, bare and in a line
    (f"The value is {ADO} for now.", ADO),
    (f"AZURE_DEVOPS_EXT_PAT={ADO}", ADO),
]

LEFT = [
    # elements: a child element or a word on the next line, names under Key, a hex hash under Key
    "<GithubToken>\n\t<Value>$(GH_TOKEN)</Value>\n</GithubToken>",
    "<password>\n  ${DB_PASSWORD}\n</password>",
    "<Key>photos/2006/February/sample.jpg</Key>",
    f"<Key>{HEX40}</Key>",
    "<Key>DescribeS3AccessPointAttachments</Key>",
    "<Key>my-object-key-2024-01-02</Key>",
    # appSettings keys that end in 'pat' but say path or compatibility
    '<add key="ShowCompat" value="enabled-for-all-users" />',
    '<add key="OutputPath" value="bin/Release/net8.0" />',
    # credential classes and getConnection with references or placeholders
    "new UserPasswordCredential(user, password)",
    'new NetworkCredential("user", "password")',
    "DriverManager.getConnection(url, user, pass);",
    'DriverManager.getConnection("jdbc:h2:mem:test");',
    # SecureStrings from variables or prompts
    "$pw = ConvertTo-SecureString -String $env:ADMIN_PASSWORD -AsPlainText -Force",
    '$pw = ConvertTo-SecureString "$(AdminPassword)" -AsPlainText -Force',
    "$pw = Read-Host -AsSecureString",
    "$s = ConvertTo-SecureString $encrypted -Key $key",
    # -u and -p that are no user and password
    "mysql -u root -p",
    "mysql -u root -p -h db.internal",
    "docker run -u 1000 -p 8080:8080 image",
    "ssh -p 2222 -u deploy host",
    "git diff -U3 -p HEAD~1",
    "sort -u -p $PASSWORD_FILE",
    # found by a review of the round: ordinary commands, functions and pattern settings
    "docker run -d -u 1000:1000 -p 127.0.0.1:8080:80 nginx:latest",
    "docker run --rm -u root -p 0.0.0.0:9090:9090/tcp prom/prometheus",
    "mysql -u root -p mydatabase",
    "mysqldump -u root -p shopdb > backup.sql",
    "python -u main.py -p configs/base.yaml",
    "htop -u www-data -p 1234,5678,9012",
    'load_credentials("aws", "default_profile")',
    "get_credentials('github', 'repo_scope_token')",
    'set_credentials("service-name", "ProductionDatabase")',
    '<add key="DefaultFilePat" value="C:\\logs\\*.txt"/>',
    '<add key="LogPAT" value="app-%date%.log"/>',
    # 52 lower-case characters that are no token: words, too few digits, a Nix hash, in a path
    "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz",
    "thequickbrownfoxjumpsoverthelazydogthequickbrownfoxj",
    "/nix/store/0c1qb8h2k3f9a8z7m6x5v4n3b2c1d0a9-python3-3.12.1",
    f"https://dev.example/{ADO}/index.html",
]


@pytest.mark.parametrize(("text", "secret"), FOUND)
def test_the_rounds_shapes_are_redacted(text: str, secret: str) -> None:
    redacted, rules = default_detector().redact(text)
    assert rules, text
    assert secret not in redacted, redacted


@pytest.mark.parametrize("text", LEFT)
def test_their_look_alikes_are_left(text: str) -> None:
    assert default_detector().find(text) == [], text


def test_the_element_tags_stay_when_the_value_is_on_its_own_line() -> None:
    """Only the value is replaced, not the element (a rule's secret group, not its match)."""
    redacted, _ = default_detector().redact(f"<GithubToken>\n\t{HEX40}\n</GithubToken>")
    assert redacted.startswith("<GithubToken>\n\t[REDACTED:")
    assert redacted.endswith("</GithubToken>")


def test_a_long_chain_of_matches_is_found_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: each finditer match walked the rest of its chain again, so 100,000
    characters of `-u user -p pw` took 187 s (k chained tokens cost k² matches taken). Each
    match is now taken once: counted, not timed."""
    taken = TakeCounter(monkeypatch)
    copies = 2_000
    found = default_detector().find(" -u user -p pAssw0rd9" * copies)
    assert len(found) == copies  # every copy still found
    assert taken.count <= 3 * copies  # (k² before: ~2,000,000)
