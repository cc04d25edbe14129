"""values.yaml is documented key by key and values.schema.json guards it.

Goal: a wrong value (a negative replica count, an unknown key, a flag the
service does not have, a probe Kubernetes would refuse, an even number of
etcd members, an etcd endpoint with a scheme, a TLS cluster without client
certificates, an ACL operation Kafka does not have, a Kafka listener
anywhere but on the stores, ...) is refused by
`helm lint` and `helm template` with a message that names the key, before
anything reaches a cluster; the defaults pass; and every key of values.yaml
carries a comment (the coordinators' blocks share the partition store's
shape and its comments; Kubernetes objects passed through verbatim are
documented at their top).

Method: helm-python-sdk's lint, render and schema validation (Helm's own
engine, which applies values.schema.json), and a line scan of values.yaml.
"""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.helm.chart import CHART_DIR, lint_findings, render

BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "negative replicas": ({"partitionStore": {"replicas": -1}}, "/partitionStore/replicas"),
    "zero coordinators": ({"coordinator": {"replicas": 0}}, "/coordinator/replicas"),
    "replicas as text": ({"partitionStore": {"replicas": "three"}}, "/partitionStore/replicas"),
    "unknown key": ({"partitionstore": {"replicas": 3}}, "partitionstore"),
    "unknown store flag": ({"partitionStore": {"config": {"fsnyc": True}}}, "fsnyc"),
    "test-only flag": (
        {"partitionStore": {"config": {"unsafe-skip-txn-verification": True}}},
        "unsafe-skip-txn-verification",
    ),
    "flag of another service": (
        {"coordinator": {"config": {"snapshot-interval-ms": 1000}}}, "snapshot-interval-ms",
    ),
    "no internal partitions": (
        {"cluster": {"transactionStatePartitions": 0}}, "/cluster/transactionStatePartitions",
    ),
    "port out of range": ({"ports": {"grpc": 70000}}, "/ports/grpc"),
    "liveness success threshold": (
        {"coordinator": {"probes": {"liveness": {"successThreshold": 2}}}},
        "/coordinator/probes/liveness",
    ),
    "anti-affinity preset": ({"partitionStore": {"podAntiAffinity": "strict"}},
                             "/partitionStore/podAntiAffinity"),
    "disruption budget": ({"partitionStore": {"pdb": {"maxUnavailable": "half"}}},
                          "/partitionStore/pdb/maxUnavailable"),
    "volume size": ({"partitionStore": {"persistence": {"size": "ten gigs"}}},
                    "/partitionStore/persistence/size"),
    "log level": ({"logging": {"level": "verbose"}}, "/logging/level"),
    "unknown group coordinator flag": (
        {"groupCoordinator": {"config": {"session-timeout": 1}}}, "session-timeout",
    ),
    # min.insync.replicas is a topic config, not a store flag.
    "invented replication flag": (
        {"partitionStore": {"config": {"min-insync-replicas": 2}}}, "min-insync-replicas",
    ),
    "zero lease": ({"partitionStore": {"config": {"lease-ttl-s": 0}}},
                   "/partitionStore/config/lease-ttl-s"),
    "unclean election as text": (
        {"partitionStore": {"config": {"unclean-leader-election": "yes"}}},
        "/partitionStore/config/unclean-leader-election",
    ),
    "metadata root": ({"partitionStore": {"config": {"metadata-root": "oncelog"}}},
                      "/partitionStore/config/metadata-root"),
    "even etcd members": ({"etcd": {"replicas": 2}}, "/etcd/replicas"),
    "etcd endpoint with a scheme": (
        {"etcd": {"external": {"endpoints": ["http://etcd.infra:2379"]}}},
        "/etcd/external/endpoints/0",
    ),
    "etcd endpoint without a port": (
        {"etcd": {"external": {"endpoints": ["etcd.infra"]}}}, "/etcd/external/endpoints/0",
    ),
    "etcd endpoints as one string": (
        {"etcd": {"external": {"endpoints": "etcd.infra:2379"}}}, "/etcd/external/endpoints",
    ),
    "unknown etcd key": ({"etcd": {"members": 3}}, "members"),
    "etcd compaction retention": ({"etcd": {"autoCompactionRetention": "1 hour"}},
                                  "/etcd/autoCompactionRetention"),
    "etcd disruption budget": ({"etcd": {"pdb": {"maxUnavailable": -1}}},
                               "/etcd/pdb/maxUnavailable"),
    "etcd peer port": ({"etcd": {"ports": {"peer": 0}}}, "/etcd/ports/peer"),
    # The services authenticate each other by their certificates: a TLS
    # cluster always asks for client certificates.
    "no client certificates": ({"security": {"tls": {"clientAuth": "none"}}},
                               "/security/tls/clientAuth"),
    "unknown security key": ({"security": {"tls": {"enable": True}}}, "enable"),
    "authorizer": ({"security": {"authorizer": "simple"}}, "/security/authorizer"),
    "super users as one string": ({"security": {"superUsers": "User:admin"}},
                                  "/security/superUsers"),
    "super user with a semicolon": ({"security": {"superUsers": ["User:a;User:b"]}},
                                    "/security/superUsers/0"),
    "acl principal without a type": (
        {"security": {"acls": [{"principal": "alice", "resourceType": "topic",
                                "resourceName": "t", "operation": "read"}]}},
        "/security/acls/0/principal"),
    "acl operation": (
        {"security": {"acls": [{"principal": "User:a", "resourceType": "topic",
                                "resourceName": "t", "operation": "publish"}]}},
        "/security/acls/0/operation"),
    "acl pattern type": (
        {"security": {"acls": [{"principal": "User:a", "resourceType": "topic",
                                "resourceName": "t", "operation": "read",
                                "patternType": "match"}]}},
        "/security/acls/0/patternType"),
    "token issuer without a key": (
        {"security": {"oauth": {"issuers": [{"issuer": "https://login.example.com/"}]}}},
        "/security/oauth/issuers/0"),
    "ca bundle from two places": (
        {"security": {"tls": {"ca": {"configMapName": "a", "secretName": "b"}}}},
        "/security/tls/ca"),
    "certificate lifetime": (
        {"security": {"tls": {"certManager": {"duration": "90 days"}}}},
        "/security/tls/certManager/duration"),
    "private key algorithm": (
        {"security": {"tls": {"certManager": {"privateKey": {"algorithm": "DSA"}}}}},
        "/security/tls/certManager/privateKey/algorithm"),
    "acl refresh interval": ({"security": {"aclRefreshIntervalMs": 0}},
                             "/security/aclRefreshIntervalMs"),
    "client namespaces as one string": ({"networkPolicy": {"clientNamespaces": "apps"}},
                                        "/networkPolicy/clientNamespaces"),
    "client labels with a number": ({"networkPolicy": {"clientLabels": {"tier": 1}}},
                                    "/networkPolicy/clientLabels/tier"),
    "kafka port out of range": ({"ports": {"kafka": 0}}, "/ports/kafka"),
    "kafka listener as text": ({"partitionStore": {"kafka": {"enabled": "yes"}}},
                               "/partitionStore/kafka/enabled"),
    # Clients are told each store's DNS name; an address of another kind is
    # not a setting of the chart.
    "unknown kafka key": ({"partitionStore": {"kafka": {"advertisedHost": "kafka.example.com"}}},
                          "advertisedHost"),
    # The chart sets the listener from partitionStore.kafka and ports.kafka.
    "kafka listener as a flag": ({"partitionStore": {"config": {"kafka-listen": "0.0.0.0:9092"}}},
                                 "kafka-listen"),
    "kafka listener of a coordinator": ({"coordinator": {"kafka": {"enabled": True}}}, "kafka"),
    "coordinators in stores as text": ({"coordinator": {"inStores": "yes"}},
                                       "/coordinator/inStores"),
    # The chart sets it ("auto") from coordinator.inStores.
    "a store's coordinator as a flag": (
        {"partitionStore": {"config": {"transaction-coordinator": "auto"}}},
        "transaction-coordinator"),
    "group coordinators in stores as text": ({"groupCoordinator": {"inStores": "yes"}},
                                             "/groupCoordinator/inStores"),
    # The chart sets it ("auto") from groupCoordinator.inStores.
    "a store's group coordinator as a flag": (
        {"partitionStore": {"config": {"group-coordinator": "auto"}}},
        "group-coordinator"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_a_bad_value_is_refused_naming_the_key(case: str) -> None:
    values, key = BAD_VALUES[case]
    findings = lint_findings(values)
    assert findings and any(key in f for f in findings), findings
    with pytest.raises(helm.HelmValuesError, match=re.escape(key)):
        render(values)
    with helm.Chart.load(CHART_DIR) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)


def test_the_defaults_pass_the_schema() -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema({})
        chart.validate_schema(chart.values)
    assert lint_findings() == []


# Blocks handed to Kubernetes as they are; their top line is documented.
PASS_THROUGH = {
    "podSecurityContext", "containerSecurityContext", "resources", "updateStrategy",
    "probes", "retentionPolicy",
}
# Blocks documented once, in partitionStore, as values.yaml says.
SAME_SHAPE_AS_STORE = ("coordinator", "groupCoordinator")


def _undocumented_keys(text: str) -> list[str]:
    documented: set[str] = set()
    undocumented = []
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in text.splitlines():
        match = re.match(r"^(\s*)([A-Za-z0-9_.-]+):", line)
        if match and not line.lstrip().startswith("#"):
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parents = [key for _, key in stack]
            stack.append((indent, match.group(2)))
            path = ".".join(key for _, key in stack)
            store_path = ".".join(["partitionStore", *path.split(".")[1:]])
            covered = any(p in PASS_THROUGH for p in parents) or (
                path.split(".")[0] in SAME_SHAPE_AS_STORE and store_path in documented
            )
            if previous.lstrip().startswith("#"):
                documented.add(path)
            elif not covered:
                undocumented.append(path)
        if line.strip():
            previous = line
    return undocumented


def test_every_key_of_values_yaml_is_documented() -> None:
    assert _undocumented_keys((CHART_DIR / "values.yaml").read_text()) == []


def test_the_documentation_check_sees_a_missing_comment() -> None:
    text = (
        "# -- documented\na: 1\nb: 2\n"
        "partitionStore:\n  # -- x\n  c: 1\n  resources:\n    cpu: 1\n"
        "# -- documented\ncoordinator:\n  c: 2\n  d: 3\n"
    )
    # b has no comment; partitionStore.resources is a pass-through block with
    # no comment at its top; coordinator.c is covered by partitionStore.c.
    assert _undocumented_keys(text) == ["b", "partitionStore", "partitionStore.resources",
                                        "coordinator.d"]
