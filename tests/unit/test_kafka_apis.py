"""The Kafka listener's API table: one table, every part of it real.

Goal: what ApiVersions advertises is exactly what the listener serves —
every API in the table has a handler, every version in its range has kio's
request and response classes (so a request of that version decodes and its
answer encodes), and docs/kafka-protocol.md prints the same table.

Method: walks services/kafka/apis.VERSIONS against the handler registry and
kio's schema index; reads the doc's table between its markers.
"""

from __future__ import annotations

import re
from pathlib import Path

from services.kafka.apis import VERSIONS, render_table
from services.kafka.handlers import HANDLERS
from services.kafka.messages import request_class, response_class

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka-protocol.md"


def test_every_api_in_the_table_has_a_handler() -> None:
    assert set(HANDLERS) == set(VERSIONS)


def test_every_version_served_has_kio_classes() -> None:
    missing = []
    for api, served in VERSIONS.items():
        for version in range(served.min_version, served.max_version + 1):
            if request_class(api, version) is None:
                missing.append(f"{api.title} v{version}")
                continue
            response_class(api, version)
    assert missing == []


def _documented_table() -> list[tuple[str, str, str]]:
    text = DOC.read_text()
    section = re.search(r"<!-- kafka-apis: start -->\n(.*?)<!-- kafka-apis: end -->", text,
                        re.S)
    assert section is not None, f"{DOC} lost its kafka-apis markers"
    rows = []
    for line in section.group(1).splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_the_doc_prints_the_table() -> None:
    assert _documented_table() == render_table(), (
        "docs/kafka-protocol.md's API table differs from services/kafka/apis.py: print "
        "render_table()'s rows there")
