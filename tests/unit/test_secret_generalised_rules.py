"""Issue 27, fourth and fifth rounds: the generalised rules find credentials by their context or
shape (not a provider list) and leave the look-alikes that agent logs and code are full of.

The positives are made up here in the shapes the rules generalise (a provider the rules never
name), not copied from any corpus; each test fails if its rule is removed or loosened.
"""

from __future__ import annotations

import pytest

from schemas.secret_scan import default_detector

FOUND = [
    # a credential word in the key, any separator a log or config uses
    ("named-token-assignment", "zorblax key: 3f9a8B7c6D5e4F3a2B1c0D9e8F7a6B5c4D3e2F1a"),
    ("named-token-assignment", "QUUXCLOUD_API_TOKEN - 'a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6'"),
    ("named-token-assignment", "the api key was Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"),
    # a one-word service key and a random value
    ("service-named-token", "zorblax = 1f2e3d4c5b6a79808f7e6d5c4b3a2918"),
    ("service-named-token", '"quuxcloud": "sk_3c9f1e2d4b5a69788796a5b4c3d2e1f0"'),
    # Bearer / Basic anywhere, not only after Authorization:
    ("bearer-basic-credential", "echo Bearer 9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c > token.txt"),
    ("bearer-basic-credential", "the header was Basic dXNlcjpwYXNzd29yZDEyMzQ1Ng== and it worked"),
    # passwords passed to connect / login calls
    ("credential-call-argument", 'mysql_connect("localhost", "root", "Sup3rS3cret!")'),
    ("credential-call-argument", "$db = mysqli_connect($host, $user, 'Sup3rS3cret!', $name);"),
    ("credential-call-argument", 'server.login("me@corp.io", "Sup3rS3cret!")'),
    # prefixed formats bare: multi-part upper-case prefixes, base64 bodies
    (
        "prefixed-token",
        "The value is QUUX-SECRET-KEY-1XXC4XS9DXHZ6TREKQTT3XECY8VNNU7GJ83C3Y4 here.",
    ),
    ("prefixed-token", "The value is ZORB-NDM5MzAxNTc4MzA1OqEEPqHU4oTScTVkDs/JUzB7ptIf here."),
    (
        "credential-word-prefixed-hex",
        "use key_86aed0092d14dd6aae4e8ad107d52f760c5efa4bc3753730ca6983babc2b1072",
    ),
    (
        "high-entropy-segmented-token",
        "got cnvcav3RRFkl36rsXClN3-Dsygjl_oGT1-xMhXV70oxnGi6s811bfada back",
    ),
    (
        "llm-provider-key-prefix",
        "sk-ant-ort01-aB3x5YpQr7sT2uV9wXy1Zb4cD6eF8gH0iJ2kL4mN6oP8qRsT0uVwXyZ",
    ),
    # sixth round: an access key id's secret beside it, padded base64 keys, seed phrases
    ("access-id-secret-pair", "QWXZ7tHSr51ziCnfuHvwdeDw:nyK2q4hL34mCKaEvElY253q1yAF0FL"),
    ("access-id-secret-pair", "app:\nQWXZ1984R439T439HTH4\n9aR3kq2Lm8Zt4Wx7Pv1Nc6Hb0Y\n"),
    (
        "padded-base64-key",
        "got Ytg2V0Vlpuq9obd6tPWz2AKwHhBXMEWsAH+rSbz0UZUfaMVj1CFrcNQK47ygmrC4vHmc7eOp1LdM+AS5mMY=",
    ),
    (
        "seed-phrase",
        "mnemonic: river stone tiger unit valve window apple banana cherry grape lemon mango",
    ),
    # seventh round: dash-grouped keys, letters-only prefixed bodies, hex under a credential
    # key, XML elements, vault blocks, escaped JSON quotes, long versioned values
    ("dash-grouped-key", "The value is Q7-K2M9XD-4RT8WQ-ZP3LN-8HC2V-QW7RT-M4KX9 for now."),
    ("dash-grouped-key", "recovery: 7QRC-K2M9-XD4R-T8WQ-ZP3L-N8HC-2VQW-7RTM-4KX9"),
    ("prefixed-letters-token", "The value is zb_QvXkTrMwPzLsNbHdGcJfRyWqKtPmXvZsLn for now."),
    ("named-hex-credential", "zorblax key: 9c1f4e7a2b8d0f3e6a5c"),
    ("named-hex-credential", "QUUX_KEY: 9c1f4e7a2b8d0f3e6a5c"),
    ("xml-secret-element", "<quuxApiKey>Zx9Yw8Vu7Ts6Rq5</quuxApiKey>"),
    ("vault-encrypted-block", "$ANSIBLE_VAULT;1.1;AES256\n" + "3" * 20 + "6139" * 15 + "\n"),
    ("quoted-secret-assignment", '{\\"quux_secret\\": \\"Zq8rT1pXw9Lm3Nv7Bc\\"}'),
    ("service-named-token", "zorblax :'9c1F4e7A2b8D0f3E6a5C9k7R1t'"),
    ("named-uuid-credential", "quux42 = 4f2b8c1d-9e3a-4b7c-8d6e-1f0a2b3c4d5e"),
    # tenth round (kics): a token key, the Graph API Explorer's token prefix, a long literal of
    # few distinct characters under a secret-named key
    ("config-secret-assignment", "#    TokenKey: m3#Rq8@vX2!p"),
    ("token-by-prefix", "The value is EAACEdEose0cBAq7Zk2LmW9xR4tY for now."),
    ("long-named-literal", 'session_token = "zq4747474z7qz7q4z7q4z7q4z7q4zq7q4zqz47q4x"'),
    ("llm-provider-key-prefix", "The value is sk-pyx-Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd for now."),
    ("token-by-prefix", "The value is packagist_ack_9c1f4e7a2b8d0f3e6a5c7b9d1e3f for now."),
    ("token-by-prefix", "The value is e2b_9c1f4e7a2b8d0f3e6a5c7b9d1e3f5a7c9e1b3d5f for now."),
    (
        "token-by-prefix",
        "The value is mfa.Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd_Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd for now.",
    ),
    (
        "seed-phrase",
        "WALLET_MNEMONIC: river stone tiger unit valve window apple banana cherry grape "
        "lemon mango",
    ),
    ("token-by-prefix", "The value is sk-hc-v1-" + "9c1f4e7a2b8d0f3e" * 4 + " for now."),
    ("token-by-prefix", "The value is AQ.Ab8RQm7Zr2Lw9Tx4Kv8Pn3Hs6JdQm7Zr2Lw9Tx4 for now."),
    ("quay-robot-token", "login acme+deployer:" + "Q7K2M9XD4RT8WQZP" * 4),
    ("vault-unseal-key", "vault operator unseal Zq8rT1pXw9Lm3Nv7Bc+Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd5"),
    (
        "tink-keyset-key",
        '{"typeUrl":"type.googleapis.com/google.crypto.tink.HmacKey","value":"Qm7Zr2Lw9Tx4Kv8P"}',
    ),
    (
        "vapid-key-pair",
        "Zq8rT1pXw9Lm3Nv7Bc_Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd5:B" + "Qm7Zr2Lw9T" * 8 + "x4Kv8P",
    ),
    ("html-password-input", '<input name="db" type="password" value="Zq8r!T1pXw9">'),
    ("infura-project-key", "wss://mainnet.infura.io/ws/v3/9c1f4e7a2b8d0f3e6a5c7b9d1e3f5a7c"),
    ("kubernetes-bootstrap-token", "BOOTSTRAP_TOKEN=q7k2m9.xd4rt8wqzp3ln8hc"),
    ("token-by-prefix", "The value is signkey-prod-" + "9c1f4e7a2b8d0f3e" * 4 + " for now."),
    ("token-by-prefix", "The value is Mid-server-Qm7Zr2Lw9Tx4Kv8Pn3 for now."),
    ("token-by-prefix", "The value is nvapi-Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd_Qm7Zr2Lw9Tx4Kv8Pn3Hs for now."),
    ("label-line-secret", "Client Secret\n9c1f4e7a2b8d0f3e6a5c7b9d1e3f5a7c"),
    (
        "token-by-prefix",
        "The value is sk_dev_Qm7Zr2Lw9Tx4Kv8PQm7Zr2Lw9Tx4_-Kv8PQm7Zr2Lw9Tx4Kv8P for now.",
    ),
    # eleventh round (kingfisher11): SQL account passwords, an auth key, Splunk HEC, prefixes
    ("sql-password", "mysql> CREATE USER 'app'@'%' IDENTIFIED BY 'k9Lm2pQr';"),
    ("sql-password", "CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'k9Lm2pQr';"),
    ("sql-password", "GRANT ALL ON db.* TO 'app'@'localhost' IDENTIFIED BY 'k9Lm2pQr';"),
    ("sql-password", 'ALTER USER app IDENTIFIED WITH mysql_native_password BY "k9Lm2pQr";'),
    ("sql-password", "CREATE USER scott IDENTIFIED BY tiger;"),
    ("sql-password", "ALTER ROLE app WITH ENCRYPTED PASSWORD 'k9Lm2pQr';"),
    ("sql-password", "CREATE USER app PASSWORD 'k9Lm2pQr';"),
    ("auth-key-literal", "config.redis.auth = 'Zq8rT1pXw9'"),
    ("auth-key-literal", 'SMTP_AUTH: "Zq8rT1pXw9"'),
    ("named-uuid-credential", "splunk.hec=d6bd1ad4-cb62-4d80-a637-593ee2b17391"),
    ("named-uuid-credential", "hec: D6BD1AD4-CB62-4D80-A637-593EE2B17391"),
    ("token-by-prefix", "The value is xoxc-2541715624-2536568458595-2560197464944-" + "23a1" * 16),
    ("token-by-prefix", "The value is salad_cloud_user_" + "Qm7Zr2Lw9T" * 5 + " for now."),
    # its second held-out source (kingfisher12): Supabase, Unleash, Travis, ThingsBoard, XML
    ("token-by-prefix", "The value is sbp_" + "9c1f4e7a2b8d0f3e6a5c" * 2 + " for now."),
    ("token-by-prefix", "The value is sb_secret_Qm7Zr2Lw9Tx4Kv8Pn3Hs6Jd_Qm7Zr2Lw for now."),
    (
        "token-by-prefix",
        "The value is user:" + "9c1f4e7a2b8d0f3e6a5c7b9d1e3f5a7c" + "9c1f4e7a" * 3 + " now.",
    ),
    ("travis-secure-value", 'env:\n  global:\n    - secure: "' + "Qm7Zr2Lw9Tx4+Kv8Pn3/" * 4 + '"'),
    (
        "thingsboard-device-token",
        "curl -X POST https://thingsboard.cloud/api/v1/q7k2m9xd4rt8wqzp3ln8/telemetry",
    ),
    (
        "xml-secret-element",
        "<AutoLogon><Password><Value>UABAAHMAcwB3ADAAcgBkAA==</Value></Password>",
    ),
    ("config-secret-assignment", "configuration.api_key['api-secret-key'] = 'Zq8rT1pXw9Lm3Nv7'"),
    # its third held-out source (kingfisher13): Windows command lines, Voiceflow
    ("windows-cli-password", "schtasks /create /tn Backup /tr b.bat /ru admin /rp Zq8r!T1p"),
    (
        "windows-cli-password",
        "net use Z: \\\\server\\share /user:CORP\\admin Zq8r!T1p /persistent:no",
    ),
    ("windows-cli-password", "net user backup Zq8r!T1p /add"),
    ("windows-cli-password", "cmdkey /generic:git /user:admin /pass:Zq8r!T1p"),
    ("token-by-prefix", "The value is VF.DM.6421e3d5b1e4a9001d2b7c8f.a1B2c3D4e5F6g7H8 now."),
    # its fourth (trufflehog): a token among other words in a secret-named element
    (
        "xml-secret-element-token",
        "<secret>{billing ZX81QW44RT9P0LMN2BV7CX6KJ3HG5FDS}</secret>",
    ),
    # its fifth (trufflehog2): a random token under a key that names a service
    ("service-named-random-token", "apollo: Zq8rT1pXw9Lm3Nv7Bc4Kd2"),
    # the twelfth round's (trufflehog3, trufflehog4): a 20-character token among words in a
    # secret-named element, service-named tokens with separators or in lower case, a key in a
    # URL's path, a getter that returns the credential
    ("xml-secret-element-token", "<secret>{billing AQAAABAAA qz7rk2mw9xt4np8vb3ls}</secret>"),
    ("service-named-segmented-token", 'acme: "Kq3-vT9_pLm2xR7wZ4nB8cD1.fG6hJ0"'),
    ("service-named-segmented-token", "acme: q__7rvkt2zm9xp4wn8bc3ld6fh"),
    (
        "url-path-key-token",
        'url := "https://api.example.com/v1/keys/pk_7f3a9c2e81d44b6f9e0a5c1d2b"',
    ),
    ("secret-getter-literal", 'func getAcmeToken() string { return "Zq8rT1pXw9Lm3Nv7Bc4K" }'),
    ("secret-getter-literal", "def api_key(self) -> str:\n    return 'Zq8rT1pXw9Lm3Nv7Bc4K'"),
    # its third and fourth parts (trufflehog5, trufflehog6): OpenAI keys named by their owner,
    # Mailgun's segmented keys, EcoStruxure IT keys, Google OAuth client ids, table cells
    (
        "openai-key-any-name",
        "The value is sk-build-bot-Zq8rT1pXw9Lm3Nv7T3BlbkFJBc4Kd2Xy7Wq1Er5Ty9Ui for now.",
    ),
    ("mailgun-key-segments", "pass '7c1e9a3f5b2d4c6e8a0b1d3f5e7c9a1b-3f5a7c9e-1b3d5f7a'"),
    (
        "ecostruxure-it-key",
        "The value is AK1Zq8rT1pXw9Lm3Nv7Bc4Kd2/Xy7Wq1Er5Ty9Ui0Op3As6Df8Gh2Jk4Lz for now.",
    ),
    (
        "google-oauth-client-id",
        '"client_id": "123456789012-a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6.apps.googleusercontent.com",'
        ' "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty"',
    ),
    ("secret-named-table-cell", "apiKey |7c1e9a3f5b2d4c6e8a0b1d3f5e7c9a1b3f5a7c9e\nbaseUrl |x"),
    # its fifth and sixth parts (trufflehog7, trufflehog8): LaunchDarkly and SaladCloud keys
    # bare, a token after a dash in a note
    ("launchdarkly-key", "The value is sdk-7q2kx9mb-4tzr-41lc-z6q1-h7zn5fdlcybw for now."),
    (
        "saladcloud-api-key",
        "The value is salad_cloud_org_Zq8rT1pXw9Lm3Nv7Bc4Kd2Xy7Wq1Er5Ty9Ui0Op3As6 now.",
    ),
    ("secret-named-dash-literal", "acme token - 'Zq8rT1pXw9-Lm3Nv7Bc4K'"),
    # forms the review found missed: getters with modifiers or expression bodies, a Unicode dash
    # and quotes, an OpenAI key in a URL-encoded form
    ("secret-getter-literal", 'fun apiKey() = "Zq8rT1pXw9Lm3Nv7Bc4Kd2"'),
    ("secret-getter-literal", 'public string GetToken() => "Zq8rT1pXw9Lm3Nv7Bc4Kd2";'),
    ("secret-getter-literal", 'private static String getSecret() { return "Zq8rT1pXw9Lm3Nv7"; }'),
    ("secret-named-dash-literal", "acme token \u2014 \u2018Zq8rT1pXw9-Lm3Nv7Bc4K\u2019"),
    ("openai-key-any-name", "curl -d key%3Dsk-bot-Zq8rT1pXw9Lm3Nv7T3BlbkFJBc4Kd2Xy7Wq1Er5Ty9"),
    # the thirteenth round's (trufflehog9 .. trufflehog11): prefixed formats bare (a Stripe
    # payment intent's client secret, Ticket Tailor, TruffleHog Enterprise, Voiceflow workspace
    # and legacy keys, Zoho OAuth tokens, Shutterstock's v2/ tokens), a quoted value on the line
    # after its key, a dotted token of more than 128 characters after a dash
    (
        "token-by-prefix",
        "The value is pi_3NqzK2Lp9XwRt7Vb4Mc8Zd1E_secret_Qw3Er5Ty7Ui9Op1As2Df4Gh6J now.",
    ),
    ("token-by-prefix", "The value is sk_7311_482019_4f0c9a8e7b6d5c4b3a291807f6e5d4c3 for now."),
    ("token-by-prefix", "The value is thog-key-5d3c1b9a7f2e4d60 for now."),
    ("token-by-prefix", "The value is VF.WS.6f1a2b3c4d5e6f7a8b9c0d1e.Zq8rT1pXw9Lm3Nv7 now."),
    ("token-by-prefix", "The value is VF.6f1a2b3c4d5e6f7a8b9c0d1e.Zq8rT1pXw9Lm3Nv7 now."),
    (
        "token-by-prefix",
        "The value is 1000.5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b.0a1b2c3d4e5f60718293a4b5c6d7e8f9 now.",
    ),
    ("token-by-prefix", "The value is v2/" + "Zq8rT1pXw9Lm3Nv7Bc4Kd2" * 15 + " for now."),
    ("config-secret-assignment", '  qs: {\n    api_key:\n      "Q7ZL3K9XW2PM8RT4VN6B",\n  },'),
    ("secret-named-dash-literal", "acme token - '" + "Zq8rT1pXw9Lm3Nv7Bc4K." * 7 + "x'"),
    # its fourth part (semgrep-rules' tests): Hugging Face organization tokens in any quotes or
    # brackets, Onfido live tokens, Mailgun public keys and Lob keys bare, an Android string
    # resource named for a key
    ("token-by-prefix", "(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)"),
    ("token-by-prefix", "The value is api_live_us.Zq8rT1pXw9L.m3Nv7Bc4Kd2Xy7Wq1Er5Ty9Ui now."),
    ("token-by-prefix", "The value is pubkey-7c1e9a3f5b2d4c6e8a0b1d3f5e7c9a1b for now."),
    ("lob-api-key", "The value is test_pub_7c1e9a3f5b2d4c6e8a0b1d3f5e7c9a1 for now."),
    ("lob-api-key", 'LOB_KEY = "live_7c1e9a3f5b2d4c6e8a0b1d3f5e7c9a1b3f"'),
    ("android-string-secret", '<string name="hockeyapp_key">7c1e9a3f5b2d4c6e8a0b1d3f5e</string>'),
    # found trying the product: an id with a 0, 1, 8 or 9 beside its own name passed whole
    ("aws-access-key-id-named", "export AWS_ACCESS_KEY_ID=AKIAUJZDE8GXD6NCF10E"),
    ("aws-access-key-id-named", '"AccessKeyId": "ASIAEKCTBR4Y1Z2IXGCI"'),
    ("aws-access-key-id-named", "aws-access-key-id: AKIA0123456789ABCD89"),  # a workflow's input
    ("aws-access-key-id-named", "aws_access_key_id = AKIA00000000ABCD1234"),
    # the fourteenth round's prefixed-bare work: documented literals the prefix list lacked
    # (Dropbox offline tokens, Dynatrace platform tokens, Cloudflare origin CA keys, Aiven,
    # Elastic Cloud) and WordPress's wp-config secrets (leaktk's tests)
    ("token-by-prefix", "The value is sl.u." + "Zq8rT1pXw9Lm3Nv7Bc4K" * 7 + " for now."),
    ("token-by-prefix", "The value is dt0s01.Q7ZL3K9XW2PM8RT4VN6B5C1D." + "Q7ZL3K9XW2PM8RT4" * 4),
    ("token-by-prefix", "v1.0-" + "7c1e9a3f5b2d" * 3 + "-" + "4c6e8a0b1d" * 3 + " now."),
    ("token-by-prefix", "The value is AVNS_Zq8rT_Lm3Nv7Bc4K for now."),
    ("token-by-prefix", "The value is essu_" + "WnE4clQxcFh3OUxtM052N0Jj" * 3 + " for now."),
    ("wordpress-config-secret", "define('NONCE_SALT', 'q7,Z ~l3k}9X wP2m(8R');"),
    ("wordpress-config-secret", 'define( "DB_PASSWORD", "Zq8r T1p!Xw9 Lm3" );'),
]

LEFT = [
    "commit 3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a",
    "Access token\nRefreshAccessTokenForTheCurrentSession",
    '<input type="password" name="pw" value="${password}"> <input type=password value="{{pw}}">',
    "run_id: otel:9ed94f9bdc36b397e11c51f77d49e01a",
    '"signature": "EqQBCkgIBRABGAIiQKx9"',
    "    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMvakNDQWVh"
    "Z0F3SUJBZ0lCQURBTkJna3Foa2lHOXcwQkFRc0ZBREFWTVJNd0VRWURWUVFERXdwcmRXSmwK",
    "hashlib.sha224: '3a854166ac5d9f023f54d517d0b39dbd'",
    'OWNER = "75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a"',
    "match=ClauseEquals(equals='qwen/qwen3-235b-a22b-instruct-2507'),",
    'route53 = get_prop("sam-property-gatewayv2-route53configuration")',
    "'sodium_crypto_pwhash_scryptsalsa208sha256_str_verify',",
    '<script src="/app.js" integrity="sha384-'
    'TtmMbnOlNfQCSOBPQVVD2beEeNCDyHXfvX7R97lflQXKQpMgBxxBCCrm2WxhkKK1"></script>',
    "Bearer authentication-scheme is used here",
    "client.login(username, password)",
    'conn.connect("db.local", 5432)',
    "SGVsbG8gZnJvbSB0aGUgaW5nZXN0IHdvcmtlciwgdGhpcyBpcyBhbiBvcmRpbmFyeSBsb2cgbWVzc2FnZS4=",
    "golang.org/x/net v0.24.0 h1:5jiYB0BjLKN8Ih+rSbz0UZUfaMVj1CFrcNQK47ygmrC4v=",
    "the wallet: is in the drawer and the seed phrase is written on the back of a card",
    # seventh round's look-alikes: dates and part numbers in groups, snake_case tests with
    # CamelCase words, hashes under resource-type names, versions
    "ISBN 978-3-16-148410-0, part ABCD-EFGH-IJKL-MNOP-QRST-UVWX, call 555-0100-2000-3000",
    "def test_ReturnsTheValueWhenTheCacheIsEmptyAndExpired():",
    '"AWS::ApiGateway::ApiKey": "48205d4ffd7feba3",',
    "<passwordLength>16</passwordLength> <tokenType>Bearer</tokenType>",
    "api_version: v1.2-rc3",
    # eleventh round's look-alikes: prose and code that say "identified by" or "password", bind
    # variables, an Oracle keyword, auth keys of words, longer words ending in auth
    "AIX filesets are identified by four decimal values: V.R.M.F.",
    "Load and return a dynamic library identified by 'name'.",
    'machine host.domain.com login log password "pass" account acct',
    'login(client, "bob", password="hunter2")',
    'cur.execute("CREATE USER %s IDENTIFIED BY %s", (name, pw))',
    "ALTER USER app IDENTIFIED BY VALUES 'S:1234';",
    "CREATE LOGIN app WITH PASSWORD = @pwd;",
    "auth = 'required'; smtp_auth: 'plain'",
    "oauth = 'client2-abcdef'; author = 'jdoe2024x'",
    "hec_index: d6bd1ad4-cb62-4d80-a637-593ee2b17391",
    "cookie: {secure: true, httpOnly: true}",
    "https://thingsboard.cloud/api/v1/devices/telemetry",
    "ssh user:root@host, user:admin",
    "net user bob /add && net user bob * && net user administrator /active:yes",
    "net use Z: \\\\server\\share /user:admin * && schtasks /query /fo LIST",
    "<token>see the docs for the refresh_token_rotation_policy setting</token>",
    "<description>the secret token is here, in a longer sentence</description>",
    "commit: Zq8rT1pXw9Lm3Nv7Bc4Kd2",
    "name: HelloWorldApplication2024",
    "title: TheQuickBrownFoxJumps",
    '"fsx:DescribeS3AccessPointAttachments", backend: "EC2ContainerServiceBackend",',
    '"fsx:ReleaseFileSystemNfsV3Locks", state = stGetValueDecoderByAsn1Spec',
    # the twelfth round's look-alikes: images, releases and versions under one-word keys, words
    # in a URL's path after keys/, getters returning attributes or words
    "image: python3.11-slim-bookworm-2024",
    "release: release-2024-12-01_final_build",
    "runtime: nodejs20.x-arm64-provided.al2023",
    "https://example.com/docs/keys/how-to-rotate-2024-keys/",
    "def get_token(self): return self._token",
    'def password_hint(self): return "ask-the-vault-owner"',
    # and of its third and fourth parts: sk- words, UUIDs and traceparents, tables of types
    "sk-learn-pipeline-T3-model and scikit-learn's sk-tree",
    "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "id 7c1e9a3f-5b2d-4c6e-8a0b-1d3f5e7c9a1b",
    "| apiKey | string | the key of the account |",
    "| token | 2024-01-01T00:00:00Z |",
    "AK1 is the first row; AK47 and AK100 are others",
    # and of its fifth and sixth parts: JDBC URLs without credentials stay (a reading made after
    # looking at trufflehog7: its jdbc cases hold none but a placeholder), words after dashes
    "jdbc:postgresql://localhost:5432/postgres and jdbc:sqlite:/data/test.db",
    "the token - 'see-the-runbook' and the password is 'https://vault.example.com/x1'",
    "api-gateway-prod-eu-west-1 and sdk-version-2024",
    # the code the segmented rule found in installed packages (47.5 findings per 10,000 chunks
    # against 44.2 before it), left since
    "max_frame_size = self._h2_state.max_outbound_frame_size",
    "location=awscrt.s3.S3ChecksumLocation.TRAILER,",
    'fips: "s3-accesspoint-fips.us-east-1.amazonaws.com"',
    "big = 0x1234567890abcdef12345",
    "func = dll._testfunc_array_in_struct2a",
    # the review of this round's rules (306 ordinary snippets, 2026-12-07): ids, names and
    # public values they took for keys
    "DELETE https://petstore.example/api/v1/tokens/3fa85f64-5717-4562-b3fc-2c963f66afa6",
    "GET https://api.cloudflare.com/client/v4/user/tokens/ed17574386854bf78a67040be0a770b0",
    "GET https://k8s.local:6443/api/v1/namespaces/ci/secrets/builder-dockercfg-x7k9p",
    "Identity added: /home/jane/keys/id_ed25519_github2024",
    "https://etherscan.io/token/0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48",
    'ami = "ami-02640b349e1d81584"',
    'snapshot = "snap-02d6e8a1c3b5f7d90"',
    '"destination": "acct_1032D82eZvKYlo2C"',
    "endpoint: my-nlb-fbea34538d9e8821.elb.us-east-1.amazonaws.com",
    'def token(self): return "https://oauth2.googleapis.com/token"',
    'def api_key(self) -> str: return "OPENAI_API_KEY_V2"',
    "if not user.check_password(raw):\n    return 'invalid_credentials_e401'",
    "export type Credential = ApiKey | OAuth2ClientCredentials",
    "| DB password | projects/acme-prod/secrets/db-password/versions/3 |",
    "| Access token | GITHUB_TOKEN_FOR_CI_V2 |",
    'case PASSWORD -> "PBKDF2WithHmacSHA256";',
    "token -> 'auth_token_v2'",
    "<token> OAuth2AuthorizationCodeFlowV2 (see RFC 6749) </token>",
    '<credential type="ssh"> github-deploy-key-2024 for the deploy job </credential>',
    "https://accounts.google.com/o/oauth2/auth?client_id=764086051850-"
    "6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com&scope=openid",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl jane@host",
    "public String getToken() { return token; } fun tokenCount() = 42",
    # the thirteenth round's look-alikes: URL paths under v2/, numbers after 1000., sk_ names,
    # a Stripe payment intent id alone, a key name followed by a nested mapping
    "GET https://api.example.com/v2/users/12345/orders?page=2",
    "1000.25 and 1000.50 in total, 1000.0e3",
    "sk_learn_model_2024 and sk_test_fixture",
    "payment pi_3NqzK2Lp9XwRt7Vb4Mc8Zd1E succeeded",
    "api_key:\n  name: primary\n  rotate: weekly",
    # and of its fourth part: test and live names, string resources that hold words or
    # references, organization names
    "def test_login_with_2fa_and_the_cache_7c1e(): live_reload_enabled = True",
    '<string name="app_key_label">Your API key</string> <string name="token">@string/x2</string>',
    "api_org_settings and api_live_reload",
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",  # AWS's documentation example
    "aws_access_key_id = AKIAXXXXXXXXXXXXXXXX",  # a placeholder
    "aws_access_key_id: ${AWS_KEY} or access_key_id=my-key",
    # and of the fourteenth round: names with a short prefix and CamelCase words, one case or
    # one digit, test names with a live_ or test_ word, base64 after a short prefix and '=',
    # versions after v1.0-, a PubNub publish key (an id its provider puts in browser code),
    # wp-config's placeholder and references
    "pub-c-7c1e9a3f-5b2d-4c6e-8a0b-1d3f5e7c9a1b and rzp_live_Nf2tP7xB5qWvYd (key ids)",
    "get_Utf8StringValue and set_ReadTimeout2 and is_HTTPSEnabled",
    "run_test_ParseHeaders and my_live_StreamTwice and do_test_x86_64_build",
    "tmp_QZXWVKLMNPRSTB and tmp_qzxwvklmnprstb9 and abc_q7zl3k9xwp2m8rt",
    "page_Zq8rT1pXw9Lm3N=2 and v1.0-rc1-2024 and v1.0-beta-3",
    "dt0 is a label; sl.u.v is a path",
    "define('AUTH_KEY', 'put your unique phrase here'); define('DB_NAME', 'wordpress_prod_db');",
    "define( 'DB_PASSWORD', getenv('WORDPRESS_DB_PASSWORD') );",
]


def test_adjacent_tokens_are_all_found() -> None:
    """A rule's trailing boundary (the newline) is also the next token's leading boundary."""
    keys = [f"dckr_pat_7awgM4jG5SQvxcvmNzhKj8PQjx{c}" for c in "oab"]
    found = default_detector().find("\n".join(keys))
    assert len(found) == 3, found


@pytest.mark.parametrize(("rule", "text"), FOUND)
def test_generalised_rule_finds_the_shape(rule: str, text: str) -> None:
    assert rule in [f.rule for f in default_detector().find(text)], text


@pytest.mark.parametrize("text", LEFT)
def test_look_alikes_are_left(text: str) -> None:
    assert default_detector().find(text) == [], text
