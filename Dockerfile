# syntax=docker/dockerfile:1
# The noetl-stream image: `noetl-stream controller|worker|provision|...` as a non-root user.
#
#   docker build -t ghcr.io/noetl/noetl-stream:0.1.0 .
#   docker run --rm ghcr.io/noetl/noetl-stream:0.1.0 worker --nats nats://worker:$PW@nats:4222 --pool default
#
# Runs with a read-only root filesystem (the Helm chart mounts an emptyDir at /tmp).

# --- build: wheels of the package and of every dependency at its version in uv.lock ------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN pip install uv==0.13.10
COPY pyproject.toml uv.lock README.md ./
COPY noetl_stream ./noetl_stream
# The runtime dependencies only (no test/dev extras), pinned with their hashes.
RUN uv export --frozen --no-emit-project --format requirements-txt --output-file requirements.txt \
 && pip wheel --wheel-dir /wheels --require-hashes -r requirements.txt \
 && pip wheel --wheel-dir /wheels --no-deps .

# --- runtime -------------------------------------------------------------------------------------------
FROM python:3.11-slim
ARG UID=10001
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/noetl \
    TMPDIR=/tmp
# tini as PID 1: forwards SIGTERM to noetl-stream (which shuts down gracefully on it) and reaps the
# children that tools may start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid "${UID}" noetl \
 && useradd --system --uid "${UID}" --gid noetl --home-dir /home/noetl --create-home --shell /usr/sbin/nologin noetl
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels noetl-stream \
 && noetl-stream --version
# Exec probe for Kubernetes (connected to NATS?), see deploy/helm/noetl-stream/values.yaml `probes`.
COPY --chmod=0755 deploy/docker/noetl-probe /usr/local/bin/noetl-probe
USER ${UID}:${UID}
WORKDIR /home/noetl
ENTRYPOINT ["tini", "--", "noetl-stream"]
CMD ["--help"]
