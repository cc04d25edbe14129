# syntax=docker/dockerfile:1
# The image the Helm chart runs (helm/oncelog): one image for every service,
# chosen by the module given to the entrypoint:
#
#   docker build -t oncelog:0.1.0 .
#   docker run oncelog:0.1.0 oncelog_server.partition_store --help
#
# Two stages: the builder installs the project and its locked dependencies
# (uv.lock) into a virtual environment; the runtime stage copies only that
# environment onto a slim base and runs as an unprivileged user. Nothing is written outside the
# data volume (/var/lib/oncelog) and /tmp, so the container runs with a
# read-only root filesystem.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# ONCELOG_COMPILE=0: the pure wheel, as the slim base has no C compiler
# anyway; said here so that the image is the same wherever it is built.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    ONCELOG_COMPILE=0
WORKDIR /src
# The image runs the versions the tests ran with: uv (pinned with hashes in
# requirements/uv.txt) installs the server's dependencies from uv.lock in
# hash-checking mode, so nothing is resolved at build time; the project itself
# goes in as a wheel, without dependencies, built by the lock's setuptools
# (pyproject.toml's build constraint).
COPY requirements/uv.txt ./requirements/uv.txt
RUN python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install --require-hashes -r requirements/uv.txt
# Only what the package is built from (see .dockerignore): the generated gRPC
# code is committed under sdk/oncelog/v1, so no protoc runs here.
COPY pyproject.toml uv.lock README.md LICENSE ./
COPY build_support ./build_support
COPY sdk ./sdk
COPY services ./services
# The Spark integration's package is part of the distribution (pyspark itself
# is an extra the image does not install: Spark jobs run on Spark's images).
COPY spark ./spark
# Every dependency ships manylinux wheels (grpcio, rocksdict, crc32c), so the
# builder needs no compiler. Bytecode is compiled now because the runtime's
# root filesystem is read-only.
RUN python3 -m venv /opt/oncelog \
    && /opt/uv/bin/uv export --frozen --no-dev --extra server --no-emit-project \
       --format requirements-txt --quiet -o /tmp/requirements.txt \
    && /opt/uv/bin/uv pip install --python /opt/oncelog/bin/python --require-hashes \
       -r /tmp/requirements.txt \
    && /opt/uv/bin/uv build --wheel --out-dir /tmp/dist \
    && /opt/uv/bin/uv pip install --python /opt/oncelog/bin/python --no-deps /tmp/dist/*.whl \
    && /opt/oncelog/bin/python -m compileall -q /opt/oncelog/lib

FROM ${PYTHON_IMAGE} AS runtime
# The uid/gid the chart's security contexts name (runAsUser/runAsGroup).
RUN groupadd --system --gid 10001 oncelog \
    && useradd --system --uid 10001 --gid oncelog --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin oncelog \
    && mkdir -p /var/lib/oncelog \
    && chown 10001:10001 /var/lib/oncelog
COPY --from=builder /opt/oncelog /opt/oncelog
# PYTHONSAFEPATH: `python -m` must not put the working directory on the
# import path, so only the installed packages can ever be imported.
ENV PATH=/opt/oncelog/bin:${PATH} \
    PYTHONSAFEPATH=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ONCELOG_DATA_DIR=/var/lib/oncelog \
    ONCELOG_LISTEN=0.0.0.0:7000 \
    ONCELOG_METRICS_PORT=9400
VOLUME ["/var/lib/oncelog"]
# gRPC, Prometheus metrics
EXPOSE 7000 9400
USER 10001:10001
ENTRYPOINT ["/opt/oncelog/bin/python", "-m"]
CMD ["oncelog_server.partition_store"]
