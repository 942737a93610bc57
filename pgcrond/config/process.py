"""What a job's process gets: its environment and its box, read against this machine.

``env_file:`` and ``${file:PATH}`` secrets are read, and users and groups
looked up, at load: a file or an account that is not here is an error for
``run`` and ``check --strict``, a warning while linting.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Mapping
from typing import cast

from pgcrond.config.envfiles import Read, fill_file_references, read_env_files
from pgcrond.config.fields import JOB
from pgcrond.config.reading import Reading
from pgcrond.config.yamlnodes import Section
from pgcrond.core.actions import Action
from pgcrond.core.box import Account, Box, Limits, runs_a_process


def read_environment(
    reading: Reading, section: Section, own: Mapping[str, object], merged: Mapping[str, object]
) -> dict[str, str] | None:
    """``env_file`` under ``env:``, then each ``${file:PATH}`` of ``env:`` read."""
    env: dict[str, str] = {}
    ok = True
    files = merged.get("env_file")
    if isinstance(files, tuple) and files:
        read = read_env_files(files)
        ok = reading.read_problems(reading.blame(section, own, "env_file"), "env_file", read)
        env.update(read.values)
    configured = merged.get("env", JOB["env"].default)
    if not isinstance(configured, Mapping):
        return None  # reported already
    own_env = own.get("env")
    for name, value in configured.items():
        read = Read()
        env[name] = fill_file_references(value, read)
        mine = isinstance(own_env, dict) and name in own_env
        blamed = section if mine or reading.defaults is None else reading.defaults
        ok = reading.read_problems(blamed, "env", read, f"{name}: ") and ok
    return env if ok else None


def read_box(
    reading: Reading,
    section: Section,
    own: Mapping[str, object],
    merged: Mapping[str, object],
    action: Action | None,
) -> Box | None:
    """Whom the job's processes run as and their limits; only jobs with processes have them.

    ``defaults:`` may set them for every job: a job without a child process
    (an in-process entrypoint, ``sql:``, ``http:``) just does not take them,
    but setting them on such a job itself is an error.
    """
    spawns = action is not None and runs_a_process(action)
    passthrough = cast(tuple[str, ...], merged.get("env_passthrough", ()))
    if not spawns:
        for name in ("user", "group", "limits"):
            if name in own and action is not None:
                reading.report(
                    section,
                    name,
                    "only for jobs that run a process: command:, shell: or entrypoint: "
                    "with isolate: true (an in-process entrypoint, sql: or http: job runs "
                    "inside pgcrond)",
                )
        return Box(env_passthrough=passthrough)
    user = merged.get("user")
    group = merged.get("group")
    account: Account | None = None
    home: str | None = None
    known = False
    gid: Account | None = None
    if isinstance(user, str | int):
        try:
            entry = pwd.getpwnam(user) if isinstance(user, str) else pwd.getpwuid(user)
        except KeyError:
            if isinstance(user, str):
                reading.machine_issue(
                    reading.blame(section, own, "user"),
                    "user",
                    f"no user {user!r} on this machine (getent passwd {user})",
                )
                if not reading.allow_unset:
                    return None
            else:
                # No passwd entry: its own number as its group, never the daemon's (root).
                account = Account(str(user), user)
                gid = Account(str(user), user)
        else:
            account = Account(entry.pw_name, entry.pw_uid)
            home, known = entry.pw_dir, True
            gid = _group_of(entry.pw_gid)
    if isinstance(group, str | int):
        try:
            found = grp.getgrnam(group) if isinstance(group, str) else grp.getgrgid(group)
            gid = Account(found.gr_name, found.gr_gid)
        except KeyError:
            if isinstance(group, str):
                reading.machine_issue(
                    reading.blame(section, own, "group"),
                    "group",
                    f"no group {group!r} on this machine (getent group {group})",
                )
                if not reading.allow_unset:
                    return None
            else:
                gid = Account(str(group), group)
    for name, wanted, current in (
        ("user", account, os.geteuid()),
        # The user's own group follows the user: said once, for the user.
        ("group", gid if "group" in merged else None, os.getegid()),
    ):
        if wanted is not None and wanted.id != current and os.geteuid() != 0:
            reading.machine_issue(
                reading.blame(section, own, name),
                name,
                f"switching to {name} {wanted.name!r} needs pgcrond to run as root "
                f"(it runs as uid {os.geteuid()}); run it as root, or leave {name}: out",
            )
            if not reading.allow_unset:
                return None
    return Box(
        user=account,
        group=gid,
        home=home,
        groups_known=known,
        limits=cast(Limits, merged.get("limits") or Limits()),
        env_passthrough=passthrough,
    )


def _group_of(gid: int) -> Account:
    """A group by its id, named when the machine knows the name."""
    try:
        return Account(grp.getgrgid(gid).gr_name, gid)
    except KeyError:
        return Account(str(gid), gid)
