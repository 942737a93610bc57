# pgcrond container image: one replica per container. Run several against the
# same PostgreSQL (deploy/kubernetes/, deploy/compose.yaml). No PostgreSQL in
# here: embedded mode is for laptops; a replica coordinates only through a
# shared server, given as PGCROND_DATABASE_URL at run time.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel is built from, so editing tests or docs keeps the cache.
COPY pyproject.toml README.md LICENSE ./
COPY pgcrond ./pgcrond
# The venv path is the same in both stages: a venv cannot be moved.
RUN python -m venv /opt/pgcrond \
    && /opt/pgcrond/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/pgcrond/bin/pip install /wheels/*.whl \
    && /opt/pgcrond/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
# OCI annotations; a release build passes the real values:
#   docker build --build-arg VERSION=$(python -c 'import pgcrond; print(pgcrond.__version__)') \
#     --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%FT%TZ) .
LABEL org.opencontainers.image.title="pgcrond" \
      org.opencontainers.image.description="Distributed cron daemon: every replica fires every tick, PostgreSQL decides which one runs it." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
# tini as PID 1: it forwards SIGTERM/SIGHUP to the daemon and reaps orphaned
# grandchildren of jobs (a job's `sh -c` that backgrounds something), which a
# Python PID 1 would leave as zombies. Debian's package, not a downloaded binary.
# Unpinned on purpose (DL3008): the base image's Debian release fixes the version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without a
# passwd lookup and volume permissions can be set ahead of time.
RUN groupadd --system --gid 10001 pgcrond \
    && useradd --system --uid 10001 --gid pgcrond --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin pgcrond \
    && install -d -m 0755 /etc/pgcrond
COPY --from=builder /opt/pgcrond /opt/pgcrond
# Unbuffered so log lines reach `docker logs` as they happen; no .pyc writes
# because the root filesystem is read-only in Kubernetes.
# TINI_SUBREAPER: when tini is not PID 1 (Kubernetes' shareProcessNamespace
# makes the pause container PID 1) it still reaps orphans, and prints no
# plain-text warning into the JSON log stream.
ENV PATH=/opt/pgcrond/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TINI_SUBREAPER=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 9464
# On SIGTERM the daemon drains running jobs for shutdown_grace (30 s), then
# stops them and releases their leases (at most 25 s more): give it more than
# shutdown_grace + 25 s (docker stop -t 60, terminationGracePeriodSeconds: 60).
STOPSIGNAL SIGTERM
# No curl in a slim image: the interpreter is already here.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=4).status != 200)"]
# Without -g tini signals the daemon alone: the daemon drains its jobs itself.
ENTRYPOINT ["/usr/bin/tini", "--", "pgcrond"]
CMD ["run", "-c", "/etc/pgcrond/", "--http", "0.0.0.0:9464"]
