"""A Spark session set up for oncelog: the one place that knows what Spark's
Python Data Source API needs on a machine.

* Spark runs data-source code in Python worker processes it starts itself,
  with `PYSPARK_PYTHON` (default: `python3` on PATH). That interpreter must
  be able to import oncelog, oncelog_spark and pyarrow, or queries fail —
  or, on this API, hang without a word. So both the workers' and the
  driver's interpreter are set to this process's own interpreter.
* Spark's JVM binds to the machine's address unless told otherwise; a local
  session is kept on 127.0.0.1 (`SPARK_LOCAL_IP`, `spark.driver.host`).
* Spark needs Java (17 or newer). `java` on PATH or `JAVA_HOME` is enough;
  nothing is hard-coded.

Used by the tests (one shared session) and by jobs that run as their own
process: `build_session("payments-job")`.

Spark Connect: a session built with `connect_server_config()` also serves
Spark Connect clients (the server plugin ships in pyspark's jars); a
client registers the source on its own session with `register(spark)`,
and the source runs in the server's Python workers as it does for a
classic session (docs/spark.md, "Spark Connect").
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from oncelog_spark.source import OncelogDataSource

if TYPE_CHECKING:
    # Importing it needs the Spark Connect client's packages (grpcio,
    # zstandard), which a classic session does not.
    from pyspark.sql.connect.session import SparkSession as ConnectSession

# Settings for a session on one machine: no web UI (a port nobody reads),
# few shuffle partitions (Spark's 200 make every small shuffle slow), UTC
# (so timestamps read back the same everywhere).
LOCAL_CONFIG: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


class SparkSetupError(RuntimeError):
    """The machine lacks something Spark needs (Java)."""


def java_available() -> bool:
    """True when Spark can find a Java runtime (JAVA_HOME or java on PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return True
    return shutil.which("java") is not None


def configure_environment(*, python: str | None = None, local: bool = True) -> None:
    """Sets the environment variables Spark reads when it starts its JVM and
    Python workers. Call before the first session of the process."""
    interpreter = python or sys.executable
    os.environ["PYSPARK_PYTHON"] = interpreter
    os.environ["PYSPARK_DRIVER_PYTHON"] = interpreter
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if not java_available():
        raise SparkSetupError(
            "Spark needs Java 17 or newer: install it (Debian: apt-get install "
            "openjdk-17-jre-headless) or set JAVA_HOME"
        )


def register(spark: SparkSession | ConnectSession) -> None:
    """Makes `format("oncelog")` known to a session (safe to call again):
    a classic session, or a Spark Connect client's (the class is sent to
    the server, whose Python workers must be able to import oncelog_spark)."""
    spark.dataSource.register(OncelogDataSource)


# The Spark Connect server, as a plugin of a classic session.
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
DEFAULT_CONNECT_PORT = 15002


def connect_server_config(*, host: str = "127.0.0.1", port: int = DEFAULT_CONNECT_PORT
                          ) -> dict[str, str]:
    """Settings for `build_session(config=...)` that make the session also
    a Spark Connect server, listening at `host:port` (clients connect to
    `sc://HOST:PORT`). No authentication: keep `host` on a trusted network."""
    if type(port) is not int or not 0 < port < 65536:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")
    return {
        "spark.plugins": CONNECT_PLUGIN,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
    }


def build_session(
    app_name: str,
    *,
    master: str = "local[2]",
    config: Mapping[str, str] | None = None,
    python: str | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """A session with the oncelog source registered.

    `master` local[N] gets LOCAL_CONFIG; `config` is applied last and wins.
    A session already running in this process is reused (Spark allows one),
    with the oncelog source registered on it.
    """
    local = master.startswith("local")
    configure_environment(python=python, local=local)
    interpreter = python or sys.executable
    builder = SparkSession.builder.master(master).appName(app_name)
    settings: dict[str, str] = {
        "spark.pyspark.python": interpreter,
        "spark.pyspark.driver.python": interpreter,
    }
    if local:
        settings.update(LOCAL_CONFIG)
    settings.update(config or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark
