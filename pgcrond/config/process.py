"""What a job's process gets: its environment and its box, read against this machine.

``env_file:`` and ``${file:PATH}`` secrets are read, and users and groups
looked up, at load: a file or an account that is not here is an error for
``run`` and ``check --strict``, a warning while linting.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar, cast

from pgcrond.config.envfiles import Read, fill_file_references, read_env_files
from pgcrond.config.fields import JOB
from pgcrond.config.reading import Reading
from pgcrond.config.yamlnodes import Section
from pgcrond.core.actions import Action
from pgcrond.core.box import Account, Box, Limits, runs_a_process

T = TypeVar("T")


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
        entry = _lookup(
            reading, section, own, "user", user, by_name=pwd.getpwnam, by_id=pwd.getpwuid
        )
        if entry is not None:
            account = Account(entry.pw_name, entry.pw_uid)
            home, known = entry.pw_dir, True
            gid = _group_of(entry.pw_gid)
        elif isinstance(user, int):
            # No passwd entry: its own number as its group, never the daemon's (root).
            account = gid = Account(str(user), user)
        elif not reading.allow_unset:
            return None
    if isinstance(group, str | int):
        found = _lookup(
            reading, section, own, "group", group, by_name=grp.getgrnam, by_id=grp.getgrgid
        )
        if found is not None:
            gid = Account(found.gr_name, found.gr_gid)
        elif isinstance(group, int):
            gid = Account(str(group), group)
        elif not reading.allow_unset:
            return None
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
        # The user's supplementary groups come with the user, unless a group is given.
        groups_known=known and "group" not in merged,
        limits=cast(Limits, merged.get("limits") or Limits()),
        env_passthrough=passthrough,
    )


# Where `getent` finds each kind of account, for the message that names it.
_GETENT = {"user": "passwd", "group": "group"}


def _lookup(
    reading: Reading,
    section: Section,
    own: Mapping[str, object],
    kind: Literal["user", "group"],
    value: str | int,
    *,
    by_name: Callable[[str], T],
    by_id: Callable[[int], T],
) -> T | None:
    """The machine's entry for a user or group, by name or id; None when it has none.

    A name the machine does not know is reported (an id needs no entry: the
    caller uses the number as it is).
    """
    try:
        return by_name(value) if isinstance(value, str) else by_id(value)
    except KeyError:
        if isinstance(value, str):
            reading.machine_issue(
                reading.blame(section, own, kind),
                kind,
                f"no {kind} {value!r} on this machine (getent {_GETENT[kind]} {value})",
            )
        return None


def _group_of(gid: int) -> Account:
    """A group by its id, named when the machine knows the name."""
    try:
        return Account(grp.getgrgid(gid).gr_name, gid)
    except KeyError:
        return Account(str(gid), gid)
