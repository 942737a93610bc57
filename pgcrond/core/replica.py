"""A replica's name: what the lease table's owner column, spread, status and hooks show.

``host:pid`` alone is unique only outside containers. Containers with the
host's name (host networking, or a runtime that keeps it) and a PID namespace
each all start the daemon as, say, ``vm:6``: fencing is unaffected (it uses
the owner token), but everything that tells replicas apart by name is wrong.
So the name is, in order:

1. the one given: ``--replica`` or ``PGCROND_REPLICA``, as it is;
2. in Kubernetes, ``HOSTNAME:pid``: ``HOSTNAME`` is the pod's name there,
   unique in its namespace (``hostNetwork: true`` pods take the node's name:
   give those ``PGCROND_REPLICA`` from the pod name instead);
3. else ``host:pid-suffix``, the suffix random and chosen once per process.

The rule, :func:`choose`, is pure (hostname, pid, environment and suffix are
passed in) so a test can give two replicas the same host and pid;
:func:`this_process` feeds it this process's own.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from pgcrond.errors import ValidationError

REPLICA_ENV = "PGCROND_REPLICA"
# Set in every pod (enableServiceLinks does not turn it off): how a process
# knows that HOSTNAME is a pod name.
KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"
MAX_NAME_LENGTH = 128
# 24 bits: replicas sharing one host and pid are a handful, not thousands.
SUFFIX_BYTES = 3


@dataclass(frozen=True)
class ReplicaName:
    """A replica's name and how it was chosen (``chosen_by`` is logged at start)."""

    name: str
    # "option" (--replica), "environment" (PGCROND_REPLICA), "pod" or "suffix".
    chosen_by: str


def check_name(name: str, field: str = "--replica") -> str:
    """``name`` if it can name a replica: printable, no spaces, at most 128 characters."""
    if not name:
        raise ValidationError(field, "must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValidationError(field, f"at most {MAX_NAME_LENGTH} characters, got {len(name)}")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise ValidationError(field, f"printable characters without spaces only, got {name!r}")
    return name


def new_suffix() -> str:
    """A fresh random suffix (6 hex digits); a process chooses one at start."""
    return secrets.token_hex(SUFFIX_BYTES)


def choose(
    *,
    hostname: str,
    pid: int,
    env: Mapping[str, str],
    suffix: str,
    given: str | None = None,
) -> ReplicaName:
    """This replica's name by the rule above; ``given`` is ``--replica`` (None: not given).

    An empty ``PGCROND_REPLICA`` counts as unset, as Compose's ``${VAR:-}`` makes it.
    """
    if given is not None:
        return ReplicaName(check_name(given), "option")
    if from_env := env.get(REPLICA_ENV):
        return ReplicaName(check_name(from_env, REPLICA_ENV), "environment")
    pod = env.get("HOSTNAME")
    if pod and env.get(KUBERNETES_ENV):
        return ReplicaName(f"{pod}:{pid}", "pod")
    return ReplicaName(f"{hostname}:{pid}-{suffix}", "suffix")


# Chosen once, at import: every name this process gives itself is the same.
_PROCESS_SUFFIX = new_suffix()


def this_process(given: str | None = None) -> ReplicaName:
    """This process's name: :func:`choose` with its hostname, pid and environment."""
    return choose(
        hostname=socket.gethostname(),
        pid=os.getpid(),
        env=os.environ,
        suffix=_PROCESS_SUFFIX,
        given=given,
    )
