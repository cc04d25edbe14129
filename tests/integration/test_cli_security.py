"""The `oncelog` command line on a secured cluster: TLS settings and `acls`.

Goal: the CLI connects to a TLS + ACL cluster with its TLS and token
settings given as flags, as ONCELOG_* environment variables or in a client
properties file (`--command-config`, Kafka's property names) — a flag
winning over the environment, which wins over the file — and without them
fails in one line saying that the cluster serves TLS and which flags to
give; a properties file with a JKS truststore or an unknown property is
refused naming the property and its line. `oncelog acls add|list|remove`
speak Kafka's kafka-acls.sh vocabulary (--allow-principal, --deny-principal,
--operation, --topic/--group/--transactional-id/--cluster,
--resource-pattern-type, --producer/--consumer) and change exactly what
they print; a bearer token from --sasl-oauth-token-file names the
principal. (`acls list --output json` is covered by test_cli_output.py.)

Method: the CLI runs as subprocesses (`python -m oncelog.cli`) against one
LocalCluster(security=True); what they did is read back with the SDK as
the super user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import AclBinding, AclFilter
from oncelog.testing import LocalCluster
from tests.support.secure_clients import admin_of, end_offsets, wait_acls_applied

CLI = [sys.executable, "-m", "oncelog.cli"]
SECURITY_ENV = ("ONCELOG_SECURITY_PROTOCOL", "ONCELOG_SSL_CAFILE", "ONCELOG_SSL_CERTFILE",
                "ONCELOG_SSL_KEYFILE", "ONCELOG_SASL_OAUTH_TOKEN_FILE", "ONCELOG_COMMAND_CONFIG")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cli-secured") / "cluster", security=True,
                      group_coordinators=0) as c:
        yield c


def run(cluster: LocalCluster, *args: str, env: dict[str, str] | None = None,
        stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in SECURITY_ENV}
    result = subprocess.run(
        [*CLI, *args], input=stdin.decode() if stdin is not None else None,
        capture_output=True, text=True, timeout=120,
        env={**base, "ONCELOG_BOOTSTRAP": cluster.bootstrap, **(env or {})})
    if check:
        assert result.returncode == 0, result.stderr
    return result


def flags(cluster: LocalCluster, name: str = "admin") -> list[str]:
    cfg = cluster.client_config(name)
    return ["--security-protocol", "SSL", "--ssl-cafile", cfg["ssl_cafile"],
            "--ssl-certfile", cfg["ssl_certfile"], "--ssl-keyfile", cfg["ssl_keyfile"]]


def env_of(cluster: LocalCluster, name: str = "admin") -> dict[str, str]:
    cfg = cluster.client_config(name)
    return {"ONCELOG_SSL_CAFILE": cfg["ssl_cafile"], "ONCELOG_SSL_CERTFILE": cfg["ssl_certfile"],
            "ONCELOG_SSL_KEYFILE": cfg["ssl_keyfile"]}


def properties(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_plain_text_to_the_tls_port_says_what_to_give(cluster: LocalCluster) -> None:
    result = run(cluster, "topics", "list", check=False)
    assert result.returncode == 1
    first, *rest = result.stderr.splitlines()
    assert first.startswith("oncelog: error: AuthenticationFailedError: ")
    assert "serves TLS, and this client connects in plain text" in first
    assert "--ssl-cafile" in first and "--command-config" in first
    assert "StatusCode" not in result.stderr  # gRPC's text only with --verbose


def test_settings_come_from_flags_env_or_a_properties_file(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cfg = cluster.client_config("admin")
    topic = "cli-sec-settings"
    run(cluster, "topics", "create", topic, *flags(cluster))
    # Environment only; the protocol follows from the files given.
    assert f"{topic}\t1" in run(cluster, "topics", "list", env=env_of(cluster)).stdout
    # A properties file, with Kafka's names, comments and `key: value`.
    config = properties(tmp_path / "client.properties", [
        "# the cluster's CA and our certificate", "security.protocol=SSL",
        f"ssl.cafile = {cfg['ssl_cafile']}", f"ssl.certfile: {cfg['ssl_certfile']}",
        f"ssl.keyfile={cfg['ssl_keyfile']}", "! also a comment"])
    assert f"{topic}\t1" in run(cluster, "topics", "list", "--command-config", config).stdout
    assert f"{topic}\t1" in run(cluster, "topics", "list",
                                env={"ONCELOG_COMMAND_CONFIG": config}).stdout
    # A flag wins over the environment, which wins over the file.
    wrong = properties(tmp_path / "wrong.properties", [
        "security.protocol=SSL", f"ssl.cafile={tmp_path / 'missing-ca.pem'}",
        f"ssl.certfile={cfg['ssl_certfile']}", f"ssl.keyfile={cfg['ssl_keyfile']}"])
    failed = run(cluster, "topics", "list", "--command-config", wrong, check=False)
    assert failed.returncode == 1 and "ssl_cafile: no such file" in failed.stderr
    assert f"{topic}\t1" in run(cluster, "topics", "list", "--command-config", wrong,
                                "--ssl-cafile", cfg["ssl_cafile"]).stdout
    assert f"{topic}\t1" in run(cluster, "topics", "list", "--command-config", wrong,
                                env={"ONCELOG_SSL_CAFILE": cfg["ssl_cafile"]}).stdout


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("ssl.truststore.location=/etc/kafka/truststore.jks",
         "client.properties:2: ssl.truststore.location is not supported: JKS/PKCS12 "
         "truststores are not read: give ssl.cafile"),
        ("sasl.jaas.config=org.apache.kafka...", "give the bearer token in a file: "
                                                 "sasl.oauthbearer.token.file"),
        ("request.timeout.ms=5000", "client.properties:2: unknown property "
                                    "'request.timeout.ms'; known: security.protocol"),
        ("sasl.mechanism=PLAIN", "sasl.mechanism must be OAUTHBEARER"),
        ("just words", "client.properties:2: expected key=value"),
    ],
)
def test_a_properties_file_it_cannot_use_is_refused_by_line(
    cluster: LocalCluster, tmp_path: Path, line: str, said: str
) -> None:
    config = properties(tmp_path / "client.properties", ["security.protocol=SSL", line])
    result = run(cluster, "topics", "list", "--command-config", config, check=False)
    assert result.returncode == 1
    assert said in result.stderr


def test_acls_add_list_remove(cluster: LocalCluster) -> None:
    admin = flags(cluster)
    added = run(cluster, "acls", "add", *admin, "--allow-principal", "User:cli-alice",
                "--operation", "Read", "--operation", "Write", "--topic", "cli-pay").stdout
    assert added.splitlines() == [
        "added ALLOW User:cli-alice Read on topic literal 'cli-pay' from host *",
        "added ALLOW User:cli-alice Write on topic literal 'cli-pay' from host *",
    ]
    run(cluster, "acls", "add", *admin, "--deny-principal", "User:cli-bob", "--deny-host",
        "10.1.2.3", "--operation", "All", "--topic", "cli-", "--resource-pattern-type",
        "prefixed")
    run(cluster, "acls", "add", *admin, "--allow-principal", "User:cli-app", "--producer",
        "--consumer", "--idempotent", "--topic", "cli-orders", "--group", "cli-workers",
        "--transactional-id", "cli-app-tx")
    with admin_of(cluster) as sdk:
        app = {(b.resource_type, b.resource_name, b.operation)
               for b in sdk.describe_acls(AclFilter(principal="User:cli-app"))}
    assert app == {
        ("topic", "cli-orders", "write"), ("topic", "cli-orders", "describe"),
        ("topic", "cli-orders", "create"), ("topic", "cli-orders", "read"),
        ("group", "cli-workers", "read"),
        ("transactional_id", "cli-app-tx", "write"), ("transactional_id", "cli-app-tx", "describe"),
        ("cluster", "oncelog-cluster", "idempotent_write"),
    }

    table = run(cluster, "acls", "list", *admin, "--principal", "User:cli-alice").stdout
    lines = table.splitlines()
    assert lines[0].split() == ["principal", "permission", "operation", "host",
                                "resource_type", "pattern_type", "resource_name"]
    assert [line.split() for line in lines[1:]] == [
        ["User:cli-alice", "allow", "read", "*", "topic", "literal", "cli-pay"],
        ["User:cli-alice", "allow", "write", "*", "topic", "literal", "cli-pay"],
    ]
    # `match`: what applies to the topic cli-pay, the prefixed deny included.
    matched = run(cluster, "acls", "list", *admin, "--topic", "cli-pay",
                  "--resource-pattern-type", "match").stdout
    assert "User:cli-bob" in matched and "User:cli-alice" in matched
    assert "User:cli-bob" not in run(cluster, "acls", "list", *admin, "--topic",
                                     "cli-pay").stdout

    removed = run(cluster, "acls", "remove", *admin, "--topic", "cli-pay",
                  "--allow-principal", "User:cli-alice", "--operation", "Write").stdout
    assert removed.splitlines() == [
        "removed ALLOW User:cli-alice Write on topic literal 'cli-pay' from host *"]
    run(cluster, "acls", "remove", *admin, "--topic", "cli-pay")
    run(cluster, "acls", "remove", *admin, "--topic", "cli-", "--resource-pattern-type",
        "prefixed")
    for resource in (["--topic", "cli-orders"], ["--group", "cli-workers"],
                     ["--transactional-id", "cli-app-tx"], ["--cluster"]):
        run(cluster, "acls", "remove", *admin, *resource, "--allow-principal", "User:cli-app")
    assert run(cluster, "acls", "remove", *admin, "--topic", "cli-pay").stdout == (
        "no ACL binding matched; nothing removed\n")
    with admin_of(cluster) as sdk:
        assert [b for b in sdk.describe_acls() if b.principal.startswith("User:cli-")] == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["add", "--operation", "Read", "--topic", "t"], "--allow-principal or --deny-principal"),
        (["add", "--allow-principal", "User:a", "--operation", "Read"], "name the resources"),
        (["add", "--allow-principal", "User:a", "--topic", "t"], "name the operations"),
        (["add", "--allow-principal", "User:a", "--consumer", "--topic", "t"],
         "--consumer needs --group"),
        (["remove", "--allow-principal", "User:a"], "name the resources whose ACLs to remove"),
    ],
)
def test_acls_usage_mistakes_exit_2(cluster: LocalCluster, args: list[str], said: str) -> None:
    result = run(cluster, "acls", *args, *flags(cluster), check=False)
    assert result.returncode == 2
    assert said in result.stderr


def test_acl_mistakes_and_refusals_are_one_line(cluster: LocalCluster) -> None:
    wrong_op = run(cluster, "acls", "add", *flags(cluster), "--allow-principal", "User:a",
                   "--operation", "ClusterAction", "--topic", "t", check=False)
    assert wrong_op.returncode == 1
    assert wrong_op.stderr.splitlines() == [
        "oncelog: error: operation ClusterAction does not apply to a topic; a topic has All, "
        "Read, Write, Create, Delete, Alter, Describe, DescribeConfigs, AlterConfigs"]
    refused = run(cluster, "acls", "list", *flags(cluster, "cli-nobody"), check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("oncelog: error: ClusterAuthorizationFailedError: ")


def test_a_token_file_names_the_principal(cluster: LocalCluster, tmp_path: Path) -> None:
    topic = "cli-token"
    with admin_of(cluster) as sdk:
        sdk.create_topic(topic, partitions=1)
        sdk.create_acls([AclBinding(principal="User:cli-writer", resource_type="topic",
                                    resource_name=topic, operation="write")])
    wait_acls_applied(cluster)
    token = tmp_path / "token"
    token.write_text(cluster.token("cli-writer") + "\n")
    carrier = cluster.client_config("cli-carrier")
    # The certificate's principal has no ACLs: the token's is the one that counts.
    refused = run(cluster, "produce", topic, *flags(cluster, "cli-carrier"),
                  stdin=b"a\n", check=False)
    assert refused.returncode == 1 and "TopicAuthorizationFailedError" in refused.stderr
    run(cluster, "produce", topic, "--ssl-cafile", carrier["ssl_cafile"],
        "--ssl-certfile", carrier["ssl_certfile"], "--ssl-keyfile", carrier["ssl_keyfile"],
        "--sasl-oauth-token-file", str(token), stdin=b"a\nb\n")
    assert sum(end_offsets(cluster, topic, 1).values()) == 2
    missing = run(cluster, "topics", "list", "--sasl-oauth-token-file",
                  str(tmp_path / "nope"), check=False)
    assert missing.returncode == 1 and "--sasl-oauth-token-file: no such file" in missing.stderr
