"""Structural schemas of the two Prometheus Operator kinds the chart renders.

kubernetes-validate ships schemas for Kubernetes' built-in kinds only, so
ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1) are checked here
instead: written from the Prometheus Operator's API reference, strict in the
same way as `kubernetes-validate --strict` (an unknown field is an error),
covering every field the chart can produce and the ones a user is likely to
add through values (relabelings). They are narrower than the real CRDs:
a field they do not know fails the test and has to be added here on purpose.
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

CRD_SCHEMAS: dict[tuple[str, str], Schema] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
