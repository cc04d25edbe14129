"""The pytest plugin users test their own code with, and LocalCluster() in a
temporary directory.

Goal: the fixtures that `oncelog.pytest_plugin` gives a user's test run
(docs/testing.md, "Testing your own code") do what that page says: the
plugin is loaded by pytest on its own and loading it starts nothing; one
cluster serves the whole session and is stopped at its end; every test gets
a topic of its own with the partitions and config its marker asks for, and
a bad marker is an error naming it; `--oncelog-bootstrap` uses a running
cluster and starts none; a `conftest.py` fixture replaces the cluster; the
page's example test file passes as written. `LocalCluster()` without a data
directory works in a temporary one that stop() deletes.

Method: each case is a user's test run in its own pytest process
(pytester's `runpytest_subprocess`, so the plugin is found through its
installed entry point as in a user's project, and the inner run's session
and modules are its own), against real local clusters. The page's example
files are read from docs/testing.md, so the page and this test cannot
drift. The inner tests write what they saw to a JSON file the outer test
checks (process ids, addresses, topic names).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "testing.md"
# A guard against a hung inner run, not an expectation (each takes seconds).
INNER_RUN_TIMEOUT_S = 240.0


def doc_block(marker: str) -> str:
    """The ```python block of docs/testing.md that follows the doc-test
    comment containing `marker`."""
    lines = DOC.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("<!-- doc-test:")
              and marker in line]
    assert len(starts) == 1, f"expected one doc-test comment naming {marker!r} in {DOC}"
    fence = next(i for i in range(starts[0] + 1, len(lines)) if lines[i].strip())
    assert lines[fence] == "```python", f"{DOC}:{fence + 1} should open the python block"
    end = lines.index("```", fence + 1)
    return "\n".join(lines[fence + 1:end]) + "\n"


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args,
                                         timeout=INNER_RUN_TIMEOUT_S)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_documented_example_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_payments=doc_block("runs this block with pytest"))
    result = run_inner(pytester)
    result.assert_outcomes(passed=2)


def test_loading_the_plugin_imports_and_starts_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="""
        import sys

        def test_plain(request):
            # Loaded through its entry point, under the entry point's name.
            assert request.config.pluginmanager.get_plugin("oncelog") is not None
            # LocalCluster lives there: not imported means nothing started.
            assert "oncelog.testing" not in sys.modules
            assert "oncelog.producer" not in sys.modules
    """)
    run_inner(pytester).assert_outcomes(passed=1)


def test_one_cluster_serves_the_session_and_each_test_gets_a_topic(
    pytester: pytest.Pytester,
) -> None:
    seen = pytester.path / "seen.jsonl"
    pytester.makepyfile(test_shared=f"""
        import json
        import pytest

        SEEN = {str(seen)!r}

        @pytest.mark.parametrize("n", range(3))
        def test_uses_the_cluster(n, oncelog_cluster, oncelog_bootstrap, oncelog_topic,
                                  oncelog_admin):
            assert oncelog_admin.list_topics()[oncelog_topic] == 1
            pids = [p.pid for procs in oncelog_cluster.processes.values() for p in procs]
            with open(SEEN, "a") as f:
                f.write(json.dumps({{"bootstrap": oncelog_bootstrap, "topic": oncelog_topic,
                                    "pids": pids}}) + "\\n")
    """)
    run_inner(pytester).assert_outcomes(passed=3)
    rows = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(rows) == 3
    assert len({row["bootstrap"] for row in rows}) == 1
    assert len({tuple(row["pids"]) for row in rows}) == 1
    assert len({row["topic"] for row in rows}) == 3
    assert all(re.fullmatch(r"test-test_uses_the_cluster-\d-\d+-[0-9a-f]{8}", row["topic"])
               for row in rows), rows
    # Stopped at the end of the session: the three services are gone.
    pids = rows[0]["pids"]
    assert len(pids) == 3
    assert [pid for pid in pids if pid_alive(pid)] == []


def test_the_topic_marker_sets_partitions_and_config(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.oncelog_topic(partitions=4, config={"retention.ms": 60000})
        def test_marked(oncelog_topic, oncelog_admin):
            description = oncelog_admin.describe_topic(oncelog_topic)
            assert len(description.partitions) == 4
            assert description.config["retention.ms"] == "60000"

        def test_unmarked(oncelog_topic, oncelog_admin):
            assert len(oncelog_admin.describe_topic(oncelog_topic).partitions) == 1
    """)
    run_inner(pytester).assert_outcomes(passed=2)


def test_a_bad_topic_marker_is_an_error_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.oncelog_topic(partitions=0)
        def test_no_partitions(oncelog_topic):
            pass

        @pytest.mark.oncelog_topic(3)
        def test_positional(oncelog_topic):
            pass

        @pytest.mark.oncelog_topic(partition=3)
        def test_misspelt(oncelog_topic):
            pass
    """)
    result = run_inner(pytester)
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([
        "*oncelog_topic(partitions=...) must be an int >= 1, got 0*",
        "*oncelog_topic takes keyword arguments only (partitions=..., config=...), got (3,)*",
        # fnmatch: "?" for the brackets, which would be a character class.
        "*oncelog_topic got ?'partition'?; it takes partitions and config*",
    ], consecutive=False)


def test_a_given_bootstrap_is_used_and_no_cluster_started(
    pytester: pytest.Pytester, tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path / "running") as running:
        seen = pytester.path / "seen.json"
        pytester.makepyfile(test_given=f"""
            import json
            import sys

            def test_uses_the_given_cluster(oncelog_bootstrap, oncelog_topic):
                assert oncelog_bootstrap == {running.bootstrap!r}
                assert "oncelog.testing" not in sys.modules
                with open({str(seen)!r}, "w") as f:
                    json.dump({{"topic": oncelog_topic}}, f)

            def test_asks_for_the_cluster_object(oncelog_cluster):
                pass
        """)
        result = run_inner(pytester, f"--oncelog-bootstrap={running.bootstrap}")
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*oncelog_cluster starts a cluster of its own, but "
                                     "--oncelog-bootstrap names one to use*"])
        topic = json.loads(seen.read_text())["topic"]
        with Admin(bootstrap=running.bootstrap) as admin:
            assert admin.list_topics()[topic] == 1


def test_a_conftest_cluster_replaces_the_default_one(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(doc_block("as a conftest.py"))
    pytester.makepyfile(test_replicated="""
        def test_three_stores(oncelog_cluster, oncelog_bootstrap, oncelog_topic,
                              oncelog_admin):
            assert len(oncelog_cluster.processes["partition_store"]) == 3
            assert oncelog_bootstrap == oncelog_cluster.bootstrap_servers
            assert len(oncelog_bootstrap.split(",")) == 3
            partition = oncelog_admin.describe_topic(oncelog_topic).partitions[0]
            assert len(partition.replicas) == 3
    """)
    run_inner(pytester).assert_outcomes(passed=1)


def _round_trip(bootstrap: str) -> list[Any]:
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic("t", partitions=1, exist_ok=True)
    with Producer(bootstrap=bootstrap) as producer:
        meta = producer.send("t", value=b"v").result()
    tp = TopicPartition("t", meta.partition)
    with Consumer(bootstrap=bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        records: list[Any] = []
        while not records:
            records = consumer.poll(timeout=1.0)
    return [r.value for r in records]


def test_a_cluster_without_a_data_dir_lives_in_a_temporary_one_deleted_by_stop() -> None:
    with LocalCluster() as cluster:
        data_dir = cluster.data_dir
        assert data_dir.is_relative_to(Path(tempfile.gettempdir()).resolve())
        assert _round_trip(cluster.bootstrap) == [b"v"]
        assert (data_dir / "partition_store-0").is_dir()
    assert not data_dir.exists()
    with pytest.raises(RuntimeError, match="which stop\\(\\) deleted; give LocalCluster a "
                                           "data_dir"):
        cluster.start()


def test_a_cluster_with_a_data_dir_keeps_it(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "kept") as cluster:
        assert _round_trip(cluster.bootstrap) == [b"v"]
    assert (tmp_path / "kept" / "partition_store-0").is_dir()
