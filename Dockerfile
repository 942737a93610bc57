# pgcrond container image: one replica per container. Run several against the
# same PostgreSQL (deploy/kubernetes/, deploy/compose.yaml). No PostgreSQL in
# here: embedded mode is for laptops; a replica coordinates only through a
# shared server, given as PGCROND_DATABASE_URL at run time.
#
# The official base, pinned by digest with its tag beside it for people. Refresh
# both together: docker buildx imagetools inspect python:3.11-slim-bookworm
# (the "Digest:" line of the index). Without a registry, build on any Debian
# base with python3 and python3-venv (docs/deployment.md, "Building the image").
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# The locked, hashed dependencies first: their layer is kept while pgcrond's
# code changes. setuptools (locked too) builds pgcrond's wheel and is removed
# with pip. Regenerate after editing pyproject.toml (docs/deployment.md):
#   printf 'setuptools>=77\n' | uv pip compile --generate-hashes --universal \
#     --python-version 3.11 pyproject.toml - -o requirements/image.lock
COPY requirements/image.lock ./requirements/
# The venv path is the same in both stages: a venv cannot be moved.
# Where pip reaches its index through a mirror or a proxy's certificate, the
# build is handed a pip.conf (and the certificate) as secrets: mounted for this
# step only, never in a layer. Without them pip uses its defaults.
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=secret,id=pip-cert \
    python -m venv /opt/pgcrond \
    && /opt/pgcrond/bin/pip install --require-hashes --no-deps --only-binary=:all: \
       -r requirements/image.lock
# Only what the wheel is built from, so editing tests or docs keeps the cache.
COPY pyproject.toml README.md LICENSE ./
COPY pgcrond ./pgcrond
# No build isolation: the build needs nothing but the locked setuptools, and no index.
RUN /opt/pgcrond/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/pgcrond/bin/pip install --no-deps --no-index /wheels/*.whl \
    && /opt/pgcrond/bin/pip uninstall --yes setuptools pip

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
# The official base ships pip, setuptools and wheel for its own python; the
# daemon's venv needs none of them, and an installer has no place in the image.
RUN groupadd --system --gid 10001 pgcrond \
    && useradd --system --uid 10001 --gid pgcrond --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin pgcrond \
    && install -d -m 0755 /etc/pgcrond \
    && if python -m pip --version >/dev/null 2>&1; then \
           python -m pip uninstall --yes --disable-pip-version-check pip setuptools wheel; \
       fi
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
