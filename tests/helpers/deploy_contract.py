"""What the deployment files must agree on with the daemon, stated once.

Every deploy test compares the Dockerfile, the systemd unit, the Kubernetes
manifests and the Compose file to these values, never to literals of its own.
Values the daemon defines are imported from it, so a change in the daemon
fails the deploy tests instead of silently drifting from them; the rest are
choices of the deployment files themselves.
"""

from __future__ import annotations

from pgcrond.config import fields as _fields
from pgcrond.config import models as _daemon
from pgcrond.daemon.lifecycle import STOP_WAIT_S

# Entry point: [project.scripts] in pyproject.toml.
CONSOLE_SCRIPT = "pgcrond"
RUN_COMMAND = "run"

# Containers listen on all interfaces so probes and scrapes can reach them.
HTTP_DEFAULT_LISTEN = _daemon.DEFAULT_HTTP_LISTEN
HTTP_PORT = int(HTTP_DEFAULT_LISTEN.rsplit(":", 1)[1])
HTTP_CONTAINER_LISTEN = f"0.0.0.0:{HTTP_PORT}"
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"

# Carries the DSN; overrides database.url.
DATABASE_URL_ENV = _fields.DATABASE_URL_ENV
DATABASE_SCHEMA = "pgcrond"
DATABASE_TABLE = "leases"

STOP_SIGNAL = "SIGTERM"
RELOAD_SIGNAL = "SIGHUP"
# After SIGTERM, running jobs drain for shutdown_grace; then the daemon stops
# what is left with the runner's stop sequence and releases the leases. It waits
# at most STOP_STEP_S for that: the stop grace twice (at most 10 s each: SIGTERM
# then SIGKILL; an in-process entrypoint is signalled, then cancelled) plus 5 s
# to record the release. Every supervisor must wait longer than
# shutdown_grace + STOP_STEP_S before its SIGKILL.
SHUTDOWN_GRACE_S = int(_daemon.DEFAULT_SHUTDOWN_GRACE.total_seconds())
STOP_STEP_S = int(STOP_WAIT_S)
SUPERVISOR_STOP_TIMEOUT_S = 60

# Containers: config directory (a ConfigMap or bind mount) and the non-root user.
CONTAINER_CONFIG_DIR = "/etc/pgcrond/"
CONTAINER_UID = 10001

# systemd: config directory and secrets file (deploy/systemd/README.md says why).
SYSTEMD_EXECUTABLE = "/usr/local/bin/pgcrond"
SYSTEMD_CONFIG_DIR = "/etc/pgcrond/conf.d/"
SYSTEMD_ENV_FILE = "/etc/pgcrond/pgcrond.env"
SYSTEMD_WATCHDOG_S = 30

# Coordination needs several replicas; disruptions and rollouts take one at a time.
REPLICAS = 3
MAX_UNAVAILABLE = 1

# Manifests are validated offline against this Kubernetes version and the
# newest one kubernetes-validate ships.
KUBERNETES_VERSION = "1.30.0"
