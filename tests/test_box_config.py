"""The box's config fields: user, group, limits, env_file, ${file:}, env_passthrough, cgroups.

Every mistake names its file, line, job and field; a problem of the machine
(a user or a file that is not here) is an error for `run` and `check
--strict`, and a warning while linting.
"""

from __future__ import annotations

import grp
import io
import json
import os
import pwd
import textwrap
from pathlib import Path

import pytest

from pgcrond.cli import main
from pgcrond.config.loader import load_config
from pgcrond.core.box import BASE_PASSTHROUGH, Account, Box, Limits
from pgcrond.core.redaction import redact
from pgcrond.errors import ConfigError, ConfigIssue, ExitCode
from pgcrond.run import box

HEAD = "database: {url: 'postgresql://app@db/jobs'}\n"
NOBODY = pwd.getpwnam("nobody")
NOBODY_GROUP = grp.getgrgid(NOBODY.pw_gid).gr_name  # nogroup on Debian
# Naming another user is an error unless pgcrond runs as root (tests/test_box.py).
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pgcrond.yaml"
    path.write_text(HEAD + textwrap.dedent(text))
    return path


def issues_of(path: Path, **kwargs: object) -> list[tuple[int | None, str | None, str | None, str]]:
    with pytest.raises(ConfigError) as raised:
        load_config([path], environ={}, **kwargs)  # type: ignore[arg-type]
    return [(i.line, i.job, i.field, i.message) for i in raised.value.issues]


def shown(issues: tuple[ConfigIssue, ...]) -> list[tuple[int | None, str | None, str | None, str]]:
    return [(i.line, i.job, i.field, i.message) for i in issues]


@ROOT_ONLY
def test_the_box_fields_are_read_and_defaults_apply_to_jobs_with_processes(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        """
        defaults:
          user: nobody
          limits: {memory: 512MiB, cpu: 50%, nofile: 1024, processes: 64}
          env_passthrough: [AWS_*]
        jobs:
          backup: {once: true, command: [id]}
          inline: {once: true, sql: "SELECT 1"}
          cheap: {once: true, shell: "true", limits: {cpu: 1.5}, group: 0}
        """,
    )
    jobs = load_config([path], environ={}).jobs
    limits = Limits(memory=512 << 20, cpu=0.5, nofile=1024, processes=64)
    assert (
        Box(
            user=Account("nobody", NOBODY.pw_uid),
            group=Account(NOBODY_GROUP, NOBODY.pw_gid),
            home=NOBODY.pw_dir,
            groups_known=True,
            limits=limits,
            env_passthrough=("AWS_*",),
        )
        == jobs["backup"].box
    )
    # An sql: job runs inside pgcrond: the defaults' user and limits are not its.
    assert Box(env_passthrough=("AWS_*",)) == jobs["inline"].box
    assert (Limits(cpu=1.5), Account("root", 0)) == (
        jobs["cheap"].box.limits,
        jobs["cheap"].box.group,
    )
    assert {"memory": "512MiB", "cpu": "50%", "nofile": "1024", "processes": "64"} == (
        limits.describe()
    )


def test_each_wrong_box_field_is_named_with_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        jobs:
          j:
            once: true
            command: [id]
            limits:
              memory: 512
              cpu: half
              nofile: 0
              procs: 3
            env_passthrough: AWS_*
            env_file: ""
          inline:
            once: true
            sql: "SELECT 1"
            user: nobody
            limits: {nofile: 10}
        """,
    )
    assert [
        (8, "j", "limits", "memory: '512' is not a size with a unit, like 512MiB, 2GiB or 500MB"),
        (9, "j", "limits", "cpu: must be a share of one CPU like 50% (or 150%), got text"),
        (10, "j", "limits", "nofile: must be a whole number 1 or more, got a number (0)"),
        (11, "j", "limits", "unknown key 'procs'; did you mean 'processes'?"),
        (
            12,
            "j",
            "env_passthrough",
            "must be a list of variable names or globs like [AWS_*], got text",
        ),
        (13, "j", "env_file", "must not be empty"),
        *[
            (
                line,
                "inline",
                name,
                "only for jobs that run a process: command:, shell: or entrypoint: with "
                "isolate: true (an in-process entrypoint, sql: or http: job runs inside pgcrond)",
            )
            for line, name in ((17, "user"), (18, "limits"))
        ],
    ] == issues_of(path)


def test_cgroups_never_is_read_and_off_is_not_taken_for_a_boolean(tmp_path: Path) -> None:
    never = write(tmp_path, "cgroups: never\njobs: {j: {once: true, command: [id]}}\n")
    assert "never" == load_config([never], environ={}).cgroups
    off = write(tmp_path, "cgroups: off\njobs: {j: {once: true, command: [id]}}\n")
    assert [(2, None, "cgroups", "a boolean (false) is not one of: auto, never")] == issues_of(off)


def test_an_unknown_user_is_an_error_to_run_and_a_warning_to_lint(tmp_path: Path) -> None:
    path = write(
        tmp_path, "jobs:\n  j:\n    once: true\n    command: [id]\n    user: no-such-user-x\n"
    )
    problem = (
        6,
        "j",
        "user",
        "no user 'no-such-user-x' on this machine (getent passwd no-such-user-x)",
    )
    assert [problem] == issues_of(path)
    linted = load_config([path], environ={}, allow_unset=True)
    assert ([problem], ["j"]) == (shown(linted.warnings), list(linted.jobs))


# -- env_file and ${file:} --------------------------------------------------------------


def test_env_file_values_sit_under_env_and_secret_names_are_never_shown(tmp_path: Path) -> None:
    (tmp_path / "a.env").write_text("SHARED=a\nAPI_TOKEN='t0k-a9f3e1'\nREGION=north\n")
    (tmp_path / "b.env").write_text("export SHARED=b\n# a comment\n\nEMPTY=\n")
    path = write(
        tmp_path,
        f"""
        jobs:
          j:
            once: true
            command: [id]
            env_file: [{tmp_path}/a.env, {tmp_path}/b.env]
            env: {{REGION: south}}
        """,
    )
    job = load_config([path], environ={}).jobs["j"]
    expected = {"SHARED": "b", "API_TOKEN": "t0k-a9f3e1", "REGION": "south", "EMPTY": ""}
    assert expected == dict(job.env)
    assert "token=*** region=north" == redact("token=t0k-a9f3e1 region=north")


def test_a_malformed_env_file_is_refused_line_by_line(tmp_path: Path) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_text("GOOD=1\nnot a line\nNOVALUE\n")
    path = write(
        tmp_path, f"jobs:\n  j:\n    once: true\n    command: [id]\n    env_file: {env_file}\n"
    )
    assert [
        (6, "j", "env_file", f"{env_file}:2: not a NAME=value line"),
        (6, "j", "env_file", f"{env_file}:3: NOVALUE has no '=value'"),
    ] == issues_of(path)


def test_a_file_secret_is_read_once_and_masked_everywhere(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cr3t-value-77\n")
    path = write(
        tmp_path,
        "jobs:\n  j:\n    once: true\n    command: [id]\n"
        f'    env: {{TOKEN: "Bearer ${{file:{secret}}}"}}\n',
    )
    job = load_config([path], environ={}).jobs["j"]
    assert "Bearer s3cr3t-value-77" == job.env["TOKEN"]
    assert "sent Bearer ***" == redact("sent Bearer s3cr3t-value-77")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        assert ExitCode.OK == main(["check", "--json", str(path)])
    (listed,) = json.loads(out.getvalue())["jobs"]
    assert {"TOKEN": "Bearer ***"} == listed["env"]


def test_a_missing_secret_file_is_an_error_to_run_and_a_warning_to_lint(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    path = write(
        tmp_path,
        "jobs:\n  j:\n    once: true\n    command: [id]\n"
        f'    env: {{TOKEN: "${{file:{gone}}}", LOCAL: "${{file:relative}}"}}\n',
    )
    assert [
        (6, "j", "env", "TOKEN: " + f"{gone}: no such file"),
        (6, "j", "env", "LOCAL: ${file:relative}: the path must be absolute"),
    ] == sorted(issues_of(path), key=lambda i: i[3], reverse=True)
    lint = write(
        tmp_path,
        f'jobs:\n  j:\n    once: true\n    command: [id]\n    env: {{TOKEN: "${{file:{gone}}}"}}\n',
    )
    config = load_config([lint], environ={}, allow_unset=True)
    assert ([(6, "j", "env", f"TOKEN: {gone}: no such file")], ["j"]) == (
        shown(config.warnings),
        list(config.jobs),
    )


def test_the_database_url_may_read_its_password_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "db-password"
    secret.write_text("pw-from-file-42\n")
    path = tmp_path / "pgcrond.yaml"
    path.write_text(
        f"database: {{url: 'postgresql://app:${{file:{secret}}}@db/jobs'}}\n"
        "jobs: {j: {once: true, command: [id]}}\n"
    )
    config = load_config([path], environ={})
    assert "postgresql://app:pw-from-file-42@db/jobs" == config.database.url
    assert "postgresql://app:***@db/jobs" == config.database.redacted_url
    secret.unlink()
    assert [(1, None, "database.url", f"{secret}: no such file")] == issues_of(path)


def test_every_job_inherits_the_base_set(tmp_path: Path) -> None:
    environ = {"PATH": "/bin", "LC_ALL": "C", "HOME": "/root", "OTHER": "x", "TZ": "UTC"}
    assert {"PATH": "/bin", "LC_ALL": "C", "HOME": "/root", "TZ": "UTC"} == Box().inherited(environ)
    assert "PATH" in BASE_PASSTHROUGH
    as_nobody = Box(user=Account("nobody", 65534), home="/home/of/nobody")
    assert {"HOME": "/home/of/nobody", "USER": "nobody", "LOGNAME": "nobody"}.items() <= (
        as_nobody.inherited(environ).items()
    )


@ROOT_ONLY
def test_check_explain_says_how_each_job_is_boxed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """
        cgroups: never
        jobs:
          backup: {once: true, command: [id], user: nobody, limits: {nofile: 64, cpu: 50%}}
          inline: {once: true, sql: "SELECT 1", env_passthrough: [AWS_*]}
        """,
    )
    assert ExitCode.OK == main(["check", "--explain", str(path)])
    text = capsys.readouterr().out
    base = ", ".join(BASE_PASSTHROUGH)
    assert (
        textwrap.dedent(
            f"""
        jobs are boxed here by rlimits: cgroups: never in the config
          memory     rlimit RLIMIT_AS (each process's address space)
          cpu        not enforced (no cgroup)
          processes  rlimit RLIMIT_NPROC (all processes of the job's user; not for root)
          nofile     rlimit RLIMIT_NOFILE (each process)
        job 'backup':
          runs as  nobody (uid {NOBODY.pw_uid}), group {NOBODY_GROUP} (gid {NOBODY.pw_gid})
          limits   cpu 50%, nofile 64
          inherits {base} (secrets never)
        job 'inline':
          runs inside pgcrond: no user, group or limits of its own
          inherits {base}, AWS_* (secrets never)
        """
        )
        in text
    )


# -- how the host boxes jobs, read from /proc/self -----------------------------------------


def fake_proc(tmp_path: Path, cgroup: str, mounts: dict[str, tuple[str, str]]) -> Path:
    """A /proc/self with these cgroup memberships and mounts (mount point -> (fs, options))."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(
        "".join(
            f"{30 + n} 23 0:{n} / {point} rw,relatime - {fs} {fs} rw,{options}\n"
            for n, (point, (fs, options)) in enumerate(mounts.items())
        )
    )
    return proc


def fake_cgroup(directory: Path, controllers: str = "") -> Path:
    directory.mkdir(parents=True)
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        (directory / name).write_text("")
    (directory / "cgroup.controllers").write_text(controllers)
    return directory


def test_a_container_s_own_cgroup_v2_is_used_and_pgcrond_moves_into_a_leaf(
    tmp_path: Path,
) -> None:
    root = fake_cgroup(tmp_path / "cg2", "cpuset cpu io memory pids")
    proc = fake_proc(tmp_path, "0::/\n", {str(root): ("cgroup2", "nsdelegate")})
    mine = root / "pgcrond.jobs" / str(os.getpid())
    assert box.Host("cgroup v2", f"delegated cgroup {root}", {"v2": mine}) == (
        box.detect("auto", prepare=False, proc=proc)
    )
    assert not (root / "pgcrond.daemon").exists()  # `check` only looks
    box.detect("auto", prepare=True, proc=proc)
    assert str(os.getpid()) == (root / "pgcrond.daemon" / "cgroup.procs").read_text()
    assert "+memory +pids +cpu" == (root / "cgroup.subtree_control").read_text()
    assert "+memory +pids +cpu" == (root / "pgcrond.jobs" / "cgroup.subtree_control").read_text()
    assert "+memory +pids +cpu" == (mine / "cgroup.subtree_control").read_text()


def test_a_cgroup_v2_that_is_not_delegated_is_left_alone(tmp_path: Path) -> None:
    service = fake_cgroup(tmp_path / "cg2" / "system.slice" / "pgcrond.service", "memory pids")
    proc = fake_proc(
        tmp_path,
        "0::/system.slice/pgcrond.service\n",
        {str(tmp_path / "cg2"): ("cgroup2", "nsdelegate")},
    )
    found = box.detect("auto", prepare=True, proc=proc)
    assert ("rlimits", f"cgroup v2 {service} is not delegated (systemd Delegate=yes)") == (
        found.mode,
        found.reason.split("; ")[0].removeprefix("no cgroup to make: "),
    )
    assert not (service / "pgcrond.daemon").exists()


def test_v1_hierarchies_are_used_when_v2_holds_no_controllers(tmp_path: Path) -> None:
    unified = fake_cgroup(tmp_path / "unified")
    freezer = fake_cgroup(tmp_path / "freezer")
    memory = fake_cgroup(tmp_path / "memory" / "pod")
    proc = fake_proc(
        tmp_path,
        "6:freezer:/\n4:memory:/pod\n0::/\n",
        {
            str(unified): ("cgroup2", "nsdelegate"),
            str(freezer): ("cgroup", "freezer"),
            str(tmp_path / "memory"): ("cgroup", "memory"),
        },
    )
    found = box.detect("auto", prepare=True, proc=proc)
    mine = Path("pgcrond", str(os.getpid()))
    assert ("cgroup v1", {"freezer": freezer / mine, "memory": memory / mine}) == (
        found.mode,
        found.parents,
    )
    assert "cgroup v2 offers no memory and pids controllers (they are on v1)" in found.reason
    assert "not enforced (no cgroup)" == found.enforcement()["cpu"]


def test_without_a_freezer_there_is_no_whole_job_kill_and_so_no_cgroup(tmp_path: Path) -> None:
    memory = fake_cgroup(tmp_path / "memory")
    proc = fake_proc(tmp_path, "4:memory:/\n", {str(memory): ("cgroup", "memory")})
    found = box.detect("auto", prepare=True, proc=proc)
    assert (
        "rlimits",
        "no cgroup to make: no cgroup v2 mount; no writable cgroup v1 freezer hierarchy",
    ) == (found.mode, found.reason)


def cgroups_in(root: Path) -> list[str]:
    """The controllers under ``root`` that hold an attempt's cgroup."""
    return sorted(path.parent.name for path in root.glob("*/*"))


@pytest.mark.parametrize(
    ("limits", "made"),
    [
        (Limits(), ["freezer"]),
        (Limits(nofile=64), ["freezer"]),
        (Limits(memory=64 << 20), ["freezer", "memory"]),
        (Limits(processes=8, cpu=0.5), ["freezer", "pids", "cpu"]),
    ],
)
async def test_a_v1_attempt_gets_a_cgroup_only_where_it_serves_the_job(
    tmp_path: Path, limits: Limits, made: list[str]
) -> None:
    # The freezer's kills the whole job; memory, pids and cpu serve only their limit.
    parents = {name: tmp_path / name for name in box.V1_CONTROLLERS}
    cell = box.Cell("report", Box(limits=limits), box.Host("cgroup v1", "test", parents))
    argv = cell.enter(["true"])
    assert made == list(cell.dirs)
    joined = argv[argv.index("pgcrond-join") + 1 : argv.index("--")]
    assert [str(parents[name] / cell.name / "cgroup.procs") for name in made] == joined
    assert sorted(made) == cgroups_in(tmp_path)
    await cell.close()
    assert [] == cgroups_in(tmp_path)
