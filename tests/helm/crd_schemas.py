"""Structural schemas of the custom resources the chart renders.

kubernetes-validate ships schemas for Kubernetes' built-in kinds only, so
the Prometheus Operator's ServiceMonitor and PrometheusRule
(monitoring.coreos.com/v1) and cert-manager's Certificate (cert-manager.io/v1)
are checked here instead: written from the projects' API references (for
Certificate, the v1 CRD's openAPIV3Schema and the validation its webhook
adds), strict in the same way as `kubernetes-validate --strict` (an unknown
field is an error), covering every field the chart can produce and the ones
a user is likely to add through values (relabelings). They are narrower than
the real CRDs: a field they do not know fails the test and has to be added
here on purpose.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

# The Operator's Duration format: units in decreasing order, e.g. "1m30s".
DURATION: Schema = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
               r"(([0-9]+)ms)?)$",
}
DNS_SUBDOMAIN: Schema = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE: Schema = {
    "type": "string",
    "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}


def strict(properties: Schema, required: tuple[str, ...] = ()) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


METADATA = strict(
    {
        "name": DNS_SUBDOMAIN,
        "namespace": {"type": "string"},
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": LABEL_KEY},
            "additionalProperties": LABEL_VALUE,
        },
        "annotations": STRING_MAP,
    },
    ("name",),
)

LABEL_SELECTOR = strict(
    {
        "matchLabels": {
            "type": "object",
            "propertyNames": {"pattern": LABEL_KEY},
            "additionalProperties": LABEL_VALUE,
        },
        "matchExpressions": {
            "type": "array",
            "items": strict(
                {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                ("key", "operator"),
            ),
        },
    }
)

RELABEL_CONFIG = strict(
    {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "minimum": 0},
        "replacement": {"type": "string"},
        "action": {
            "enum": [
                "replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                "dropequal", "DropEqual",
            ]
        },
    }
)

ENDPOINT = strict(
    {
        "port": {"type": "string", "minLength": 1},
        "targetPort": {"type": ["string", "integer"]},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "params": {"type": "object"},
        "interval": DURATION,
        "scrapeTimeout": DURATION,
        "honorLabels": {"type": "boolean"},
        "honorTimestamps": {"type": "boolean"},
        "trackTimestampsStaleness": {"type": "boolean"},
        "followRedirects": {"type": "boolean"},
        "enableHttp2": {"type": "boolean"},
        "filterRunning": {"type": "boolean"},
        "relabelings": {"type": "array", "items": RELABEL_CONFIG},
        "metricRelabelings": {"type": "array", "items": RELABEL_CONFIG},
    }
)

SERVICE_MONITOR = strict(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": METADATA,
        "spec": strict(
            {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
                "selector": LABEL_SELECTOR,
                "namespaceSelector": strict(
                    {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    }
                ),
                "sampleLimit": {"type": "integer", "minimum": 0},
                "targetLimit": {"type": "integer", "minimum": 0},
            },
            ("selector", "endpoints"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

RULE = {
    **strict(
        {
            "record": {"type": "string", "minLength": 1},
            "alert": {"type": "string", "minLength": 1},
            "expr": {"type": ["string", "integer"], "minLength": 1},
            "for": DURATION,
            "keep_firing_for": DURATION,
            "labels": STRING_MAP,
            "annotations": STRING_MAP,
        },
        ("expr",),
    ),
    # A rule records a series or raises an alert, never both.
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
}

PROMETHEUS_RULE = strict(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": strict(
            {
                "groups": {
                    "type": "array",
                    "items": strict(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "interval": DURATION,
                            "query_offset": DURATION,
                            "limit": {"type": "integer", "minimum": 0},
                            "partial_response_strategy": {"type": "string"},
                            "labels": STRING_MAP,
                            "rules": {"type": "array", "items": RULE},
                        },
                        ("name",),
                    ),
                }
            }
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

# Go's time.ParseDuration format, which cert-manager parses durations with.
GO_DURATION: Schema = {
    "type": "string",
    "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$",
}
STRING_LIST: Schema = {"type": "array", "items": {"type": "string"}}
# Certificate.spec.usages: cert-manager's KeyUsage values.
KEY_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
]

CERTIFICATE = strict(
    {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": METADATA,
        "spec": {
            **strict(
                {
                    "secretName": DNS_SUBDOMAIN,
                    "secretTemplate": strict({"annotations": STRING_MAP, "labels": STRING_MAP}),
                    "commonName": {"type": "string", "maxLength": 64},
                    "literalSubject": {"type": "string"},
                    "subject": strict({
                        key: STRING_LIST for key in (
                            "organizations", "countries", "organizationalUnits", "localities",
                            "provinces", "streetAddresses", "postalCodes")
                    } | {"serialNumber": {"type": "string"}}),
                    "dnsNames": {"type": "array", "items": {
                        "type": "string",
                        "pattern": r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                                   r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                    }},
                    "ipAddresses": STRING_LIST,
                    "uris": STRING_LIST,
                    "emailAddresses": STRING_LIST,
                    "duration": GO_DURATION,
                    "renewBefore": GO_DURATION,
                    "renewBeforePercentage": {"type": "integer", "exclusiveMinimum": 0,
                                              "exclusiveMaximum": 100},
                    "isCA": {"type": "boolean"},
                    "usages": {"type": "array", "items": {"enum": KEY_USAGES}},
                    "privateKey": strict({
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "encoding": {"enum": ["PKCS1", "PKCS8"]},
                        "size": {"type": "integer"},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    }),
                    "issuerRef": strict(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "kind": {"type": "string"},
                            "group": {"type": "string"},
                        },
                        ("name",),
                    ),
                    "encodeUsagesInRequest": {"type": "boolean"},
                    "revisionHistoryLimit": {"type": "integer", "minimum": 1},
                    "additionalOutputFormats": {"type": "array", "items": strict(
                        {"type": {"enum": ["DER", "CombinedPEM"]}}, ("type",))},
                },
                ("secretName", "issuerRef"),
            ),
            # The webhook's rules: a certificate names something; literalSubject
            # excludes commonName and subject; renewBefore excludes its
            # percentage form.
            "anyOf": [{"required": [key]} for key in (
                "commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses",
                "literalSubject")],
            "allOf": [
                {"not": {"required": ["literalSubject", "commonName"]}},
                {"not": {"required": ["literalSubject", "subject"]}},
                {"not": {"required": ["renewBefore", "renewBeforePercentage"]}},
            ],
        },
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

CRD_SCHEMAS: dict[tuple[str, str], Schema] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
    ("cert-manager.io/v1", "Certificate"): CERTIFICATE,
}
