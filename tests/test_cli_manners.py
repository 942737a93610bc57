"""The CLI's manners, through the real command line against a real PostgreSQL.

Closed pipes, colour, one output convention (``-o text|wide|json``), shell
completion and the manual page, ``init``, who paused, history without
pgcrond's own rows, and the config errors of cron steps and ``@reboot``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcrond.cli import HANDLERS, build_parser
from pgcrond.config.loader import load_config
from pgcrond.config.models import changed_fields
from pgcrond.ops.shell import MANPAGE, render_manpage
from tests.helpers.daemon_harness import cluster

PGCROND = Path(sys.executable).parent / "pgcrond"
ROOT = Path(__file__).resolve().parent.parent

# More than a pipe's 64 KiB buffer, so that the writer is still writing when
# `head -1` leaves: the closed pipe is met for certain, not by luck of timing.
MANY = 1500

Result = subprocess.CompletedProcess[str]


def environment(dsn: str, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PGCROND_") and key not in ("NO_COLOR", "SUDO_USER")
    }
    env.update(PGCROND_DATABASE_URL=dsn, **extra)
    return env


def cli(env: dict[str, str], *argv: str) -> Result:
    return subprocess.run(
        [str(PGCROND), *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def write(tmp_path: Path, schema: str, jobs: str, name: str = "pgcrond.yaml") -> str:
    path = tmp_path / name
    path.write_text(
        f"database:\n  url: ${{PGCROND_DATABASE_URL}}\n  schema: {schema}\njobs:\n{jobs}"
    )
    return str(path)


JOBS = (
    '  hello: {cron: "*/5 * * * *", command: ["/bin/true"]}\n'
    '  broken: {cron: "0 3 * * *", command: ["/bin/false"]}\n'
)


def many_jobs(count: int) -> str:
    return "".join(
        f'  job-{i:04d}: {{cron: "*/5 * * * *", command: ["/bin/true"]}}\n' for i in range(count)
    )


def add_rows(dsn: str, schema: str, code: str, count: int) -> None:
    """``count`` finished ticks of ``code``, a minute apart, as the daemon leaves them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".leases (lock_key, type, code, run_key, status, owner_token, '
            "owner, attempt, fencing_token, lease_ms, created_at, acquired_at, heartbeat_at, "
            "expires_at, finished_at) "
            "SELECT 'test:' || %(code)s || ':' || g, 'SCHEDULE', %(code)s, "
            "to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), 'SUCCESS', "
            f"gen_random_uuid(), 'web-1:100', 1, nextval('\"{schema}\".leases_fencing_seq'), "
            "30000, t, t, t, t + interval '30 seconds', t + interval '1 second' "
            "FROM generate_series(1, %(count)s) AS g, "
            "LATERAL (SELECT timestamptz '2026-01-01' + g * interval '1 minute' AS t) AS at",
            {"code": code, "count": count},
        )


# -- 1. a closed pipe -------------------------------------------------------------


def piped_to_head(env: dict[str, str], *argv: str) -> Result:
    """``pgcrond ARGV | head -1`` in a real shell; the exit code is pgcrond's (pipefail)."""
    return subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | head -1', "pipe", str(PGCROND), *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=120,
    )


@pytest.mark.usefixtures("subprocesses")
@pytest.mark.parametrize("command", ["check", "next", "status", "history"])
def test_a_reader_that_leaves_early_gets_one_line_and_no_traceback(
    command: str, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = environment(pg_dsn)
    config = write(tmp_path, schema, many_jobs(MANY))
    argv = {
        "check": ["check", config],
        "next": ["next", config, "-n", "3"],
        "status": ["status", "-c", config],
        "history": ["history", "-c", config, "--limit", str(MANY)],
    }[command]
    if command in ("status", "history"):
        assert 0 == cli(env, "migrate", "-c", config).returncode
        add_rows(pg_dsn, schema, "job-0000", MANY)

    piped = piped_to_head(env, *argv)

    assert (141, "") == (piped.returncode, piped.stderr)
    assert 1 == len(piped.stdout.splitlines())


# -- 2. colour -----------------------------------------------------------------------


def on_a_terminal(env: dict[str, str], *argv: str) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal; the exit code and all it wrote there."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(PGCROND), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(60), b"".join(chunks).decode(errors="replace")


ESCAPE = "\x1b["


@pytest.mark.usefixtures("subprocesses")
@pytest.mark.parametrize(
    ("no_color", "flags", "coloured"),
    [
        (None, [], True),
        ("1", [], False),
        # no-color.org: an empty NO_COLOR is as good as none.
        ("", [], True),
        (None, ["--color", "never"], False),
        # The command line beats the environment.
        ("1", ["--color", "always"], True),
    ],
)
def test_log_lines_on_a_terminal_are_coloured_unless_no_color_or_color_never(
    no_color: str | None,
    flags: list[str],
    coloured: bool,
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
) -> None:
    env = environment(pg_dsn, **({} if no_color is None else {"NO_COLOR": no_color}))
    config = write(tmp_path, schema, JOBS)

    code, written = on_a_terminal(env, "trigger", "--here", "-c", config, "hello", *flags)

    assert 0 == code, written
    assert "run_finished" in written
    assert coloured == (ESCAPE in written)


@pytest.mark.usefixtures("subprocesses")
def test_color_always_colours_console_lines_off_a_terminal_too(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    config = write(tmp_path, schema, JOBS)
    argv = ["trigger", "--here", "-c", config, "hello", "--log-format", "console"]

    always = cli(environment(pg_dsn), *argv, "--color", "always")
    auto = cli(environment(pg_dsn), *argv, "--run-key", "manual:again")

    assert (0, 0) == (always.returncode, auto.returncode)
    assert ESCAPE in always.stderr
    assert ESCAPE not in auto.stderr and "run_finished" in auto.stderr


# -- 4. one output convention ---------------------------------------------------------


def one_document(result: Result, code: int = 0) -> Any:
    """Exactly one JSON document on stdout (json.loads refuses anything after it)."""
    assert code == result.returncode, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.mark.usefixtures("subprocesses")
def test_every_printing_command_prints_one_json_document_with_o_json(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = environment(pg_dsn, USER="ops")
    config = write(tmp_path, schema, JOBS)

    assert {"hello", "broken"} == {
        job["code"] for job in one_document(cli(env, "check", config, "-o", "json"))["jobs"]
    }
    assert 3 == len(
        one_document(cli(env, "next", config, "-o", "json", "-n", "3"))["jobs"][0]["ticks"]
    )
    migrated = one_document(cli(env, "migrate", "-c", config, "-o", "json"))
    assert (f"{schema}.leases", True) == (migrated["table"], len(migrated["applied"]) > 0)

    ran = one_document(cli(env, "trigger", "--here", "-c", config, "hello", "-o", "json"))
    assert {"job": "hello", "outcome": "success", "ran_here": True} == {
        key: ran[key] for key in ("job", "outcome", "ran_here")
    }
    assert ran["run_key"].startswith("manual:")
    failed = one_document(
        cli(
            env,
            "trigger",
            "--here",
            "-c",
            config,
            "broken",
            "--run-key",
            "manual:one",
            "-o",
            "json",
        ),
        1,
    )
    assert ("fail", True) == (failed["outcome"], failed["ran_here"])
    again = one_document(
        cli(
            env,
            "trigger",
            "--here",
            "-c",
            config,
            "hello",
            "--run-key",
            ran["run_key"],
            "-o",
            "json",
        ),
        3,
    )
    assert ("lose", False) == (again["outcome"], again["ran_here"])
    detached = one_document(
        cli(
            env, "trigger", "-c", config, "hello", "--detach", "--run-key", "manual:d", "-o", "json"
        )
    )
    assert ("requested", False, None) == (
        detached["outcome"], detached["ran_here"], detached["note"]
    )  # fmt: skip

    unlocked = one_document(
        cli(env, "unlock", "-c", config, "broken", "--run-key", "manual:one", "--yes", "-o", "json")
    )
    assert (True, "FAIL", False) == (
        unlocked["released"], unlocked["was"]["status"], unlocked["initial"]
    )  # fmt: skip

    paused = one_document(cli(env, "pause", "-c", config, "hello", "-o", "json"))
    assert ["hello"] == [pause["job"] for pause in paused["paused"]]
    assert paused["paused"][0]["by"].startswith("ops (")
    status = one_document(cli(env, "status", "-c", config, "-o", "json"))
    assert {"hello", "broken"} == {entry["job"] for entry in status["jobs"]}
    alias = one_document(cli(env, "status", "-c", config, "--json"))
    assert [sorted(entry) for entry in status["jobs"]] == [sorted(e) for e in alias["jobs"]]
    resumed = one_document(cli(env, "resume", "-c", config, "hello", "-o", "json"))
    assert (["hello"], None) == (resumed["resumed"], resumed["still_paused_all"])
    assert resumed["by"].startswith("ops (")
    nothing = one_document(cli(env, "resume", "-c", config, "hello", "-o", "json"), 1)
    assert [] == nothing["resumed"]

    history = one_document(cli(env, "history", "-c", config, "-o", "json"))
    assert {("hello", "SUCCESS"), ("broken", "FAIL")} <= {(h["job"], h["status"]) for h in history}
    plan = one_document(cli(env, "catch-up", "-c", config, "--dry-run", "-o", "json"))
    assert (True, True, []) == (plan["dry_run"], plan["done"], plan["runs"])
    done = one_document(cli(env, "catch-up", "-c", config, "-o", "json"))
    assert (False, True) == (done["dry_run"], done["done"])
    pruned = one_document(cli(env, "prune", "-c", config, "-o", "json"))
    assert f"{schema}.leases" == pruned["table"]
    assert {"abandoned", "deleted", "requests"} <= set(pruned)


@pytest.mark.usefixtures("subprocesses")
def test_unlock_with_o_json_does_not_ask_and_says_to_pass_yes(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = environment(pg_dsn)
    config = write(tmp_path, schema, JOBS)
    assert 0 == cli(env, "migrate", "-c", config).returncode

    refused = cli(env, "unlock", "-c", config, "broken", "--run-key", "manual:x", "-o", "json")

    assert (2, "") == (refused.returncode, refused.stdout)
    assert "pass --yes" in refused.stderr


@pytest.mark.usefixtures("subprocesses")
def test_status_is_seven_columns_by_default_and_twelve_with_o_wide(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = environment(pg_dsn)
    config = write(tmp_path, schema, JOBS)
    assert 0 == cli(env, "trigger", "--here", "-c", config, "hello").returncode

    narrow, wide = cli(env, "status", "-c", config), cli(env, "status", "-c", config, "-o", "wide")

    headers = [re.split(r"\s{2,}", out.stdout.splitlines()[0]) for out in (narrow, wide)]
    assert ["JOB", "SCHEDULE", "GUARD", "NEXT FIRE", "LAST RUN", "RUNNING", "FAILS"] == headers[0]
    assert 12 == len(headers[1])
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 100
    hello = next(line for line in narrow.stdout.splitlines() if line.startswith("hello"))
    assert re.fullmatch(
        r"hello\s+\*/5 \* \* \* \*\s+lease\s+in \S+\s+SUCCESS \S+ ago\s+-\s+0", hello
    ), hello


# -- 5. completion and the manual page ------------------------------------------------


@pytest.mark.usefixtures("subprocesses")
def test_the_bash_completion_is_valid_bash_and_completes_the_commands() -> None:
    script = cli(environment(""), "completion", "bash")
    assert 0 == script.returncode
    named = re.search(r"^_shtab_pgcrond_subparsers=\((.*)\)$", script.stdout, re.M)
    assert named is not None
    assert set(HANDLERS) == set(named.group(1).split())

    syntax = subprocess.run(
        ["bash", "-n"], input=script.stdout, capture_output=True, text=True, check=False
    )
    completed = subprocess.run(
        [
            "bash",
            "-c",
            "source /dev/stdin; "
            'COMP_WORDS=(pgcrond st); COMP_CWORD=1; _shtab_pgcrond; echo "${COMPREPLY[*]}"; '
            'COMP_WORDS=(pgcrond status -o ""); COMP_CWORD=3; _shtab_pgcrond; '
            'echo "${COMPREPLY[*]}"',
        ],
        input=script.stdout,
        capture_output=True,
        text=True,
        check=False,
    )

    assert (0, "") == (syntax.returncode, syntax.stderr)
    assert ["status", "text wide json"] == completed.stdout.splitlines(), completed.stderr


@pytest.mark.usefixtures("subprocesses")
def test_zsh_and_fish_completions_name_every_command() -> None:
    zsh = cli(environment(""), "completion", "zsh")
    fish = cli(environment(""), "completion", "fish")

    assert (0, 0) == (zsh.returncode, fish.returncode)
    assert zsh.stdout.startswith("#compdef pgcrond")
    if shutil.which("zsh"):
        assert (
            0 == subprocess.run(["zsh", "-n"], input=zsh.stdout, text=True, check=False).returncode
        )
    subcommands = set(re.findall(r"-n __fish_use_subcommand -a (\S+)", fish.stdout))
    assert set(HANDLERS) == subcommands
    assert (
        "complete -c pgcrond -n '__fish_seen_subcommand_from status' "
        "-s o -l output -x -a 'text wide json'" in fish.stdout
    )
    assert (
        "complete -c pgcrond -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'"
        in fish.stdout
    )


@pytest.mark.usefixtures("subprocesses")
def test_the_manual_page_renders_with_every_command() -> None:
    page = cli(environment(""), "manpage")
    assert 0 == page.returncode
    if shutil.which("man"):
        shown = subprocess.run(
            ["man", "-l", "-"],
            input=page.stdout,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "MANWIDTH": "100", "MANPAGER": "cat", "PAGER": "cat"},
        )
        assert (0, "") == (shown.returncode, shown.stderr)
        text = shown.stdout
    else:
        text = page.stdout
    assert page.stdout.startswith('.TH PGCROND "1"')
    assert re.search(r"^\.SH NAME\npgcrond \\- ", page.stdout, re.M)
    for command in HANDLERS:
        assert f"pgcrond {command}".replace("-", r"\-") in page.stdout
    assert "pgcrond status" in text


def test_the_shipped_manual_page_is_generated_from_the_parser() -> None:
    shipped = (ROOT / "pgcrond" / MANPAGE).read_text("utf-8")
    fresh = render_manpage(build_parser())

    # The .TH line carries the day it was generated.
    def body(page: str) -> list[str]:
        return page.splitlines()[1:]

    assert body(fresh) == body(shipped), (
        "the CLI changed: regenerate the page with `python -m pgcrond.ops.shell`"
    )


# -- 6. init ---------------------------------------------------------------------------


@pytest.mark.usefixtures("subprocesses")
def test_init_writes_a_starter_config_that_check_accepts_and_never_overwrites_unasked(
    tmp_path: Path,
) -> None:
    env = environment("postgresql://app@db.internal/app")
    path = tmp_path / "pgcrond.yaml"

    written = cli(env, "init", str(path))
    checked = cli(env, "check", str(path), "--strict")
    path.write_text("# mine\n")
    refused = cli(env, "init", str(path))
    kept = path.read_text()
    forced = cli(env, "init", str(path), "--force")
    printed = cli(env, "init", "-")

    assert (0, 0) == (written.returncode, checked.returncode), written.stderr + checked.stderr
    assert "config OK: 1 job" in checked.stdout
    assert 2 == refused.returncode
    assert f"{path} exists; not overwritten (pass --force" in refused.stderr
    assert "# mine\n" == kept
    assert 0 == forced.returncode
    assert path.read_text() == printed.stdout
    assert printed.stdout.startswith("# pgcrond configuration")


# -- 7. who paused ---------------------------------------------------------------------


@pytest.mark.usefixtures("subprocesses")
def test_pause_records_by_and_otherwise_the_operator_beside_the_process(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = environment(pg_dsn, USER="bob", LOGNAME="bob")
    config = write(tmp_path, schema, JOBS)

    assert 0 == cli(env, "pause", "-c", config, "hello", "--by", "alice").returncode
    by_sudo = cli({**env, "SUDO_USER": "carol"}, "pause", "-c", config, "broken", "--reason", "db")
    status = one_document(cli(env, "status", "-c", config, "-o", "json"))
    wide = cli(env, "status", "-c", config, "-o", "wide").stdout
    narrow = cli(env, "status", "-c", config).stdout
    resumed = cli(env, "resume", "-c", config, "hello")

    assert 0 == by_sudo.returncode
    paused = {entry["job"]: entry["paused"]["by"] for entry in status["jobs"]}
    assert re.fullmatch(r"alice \(\S+:\d+\S*\)", paused["hello"]), paused
    assert re.fullmatch(r"carol \(\S+:\d+\S*\)", paused["broken"]), paused
    assert f"by {paused['broken']}: db" in wide
    jobs = narrow.partition("\n\n")[0]  # the live replicas follow the table
    assert all(" paused " in line for line in jobs.splitlines()[1:])
    assert re.match(r"resumed hello \(by bob \(\S+\)\)", resumed.stdout)


@pytest.mark.usefixtures("subprocesses")
def test_an_empty_by_is_refused_with_what_to_write(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    config = write(tmp_path, schema, JOBS)

    refused = cli(environment(pg_dsn), "pause", "-c", config, "hello", "--by", " ")

    assert 2 == refused.returncode
    assert "--by ' ': give a name of printable characters, like --by alice" in refused.stderr


# -- 8. a reload says what changed -----------------------------------------------------


def test_the_same_config_loaded_twice_has_no_changed_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCROND_DATABASE_URL", "postgresql://app@db/app")
    first, second = (load_config([ROOT / "config" / "example.yaml"]) for _ in range(2))

    assert first.jobs == second.jobs
    assert all([] == changed_fields(first.jobs[c], second.jobs[c]) for c in first.jobs)


@pytest.mark.usefixtures("system_processes")
def test_a_reload_logs_only_the_jobs_that_changed_and_which_fields(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    def jobs(every: str, timeout: str) -> str:
        return (
            f'  kept: {{cron: "0 3 * * *", command: ["/bin/true"]}}\n'
            f'  moved: {{cron: "{every}", command: ["/bin/true"]}}\n'
            f'  slower: {{cron: "0 4 * * *", command: ["/bin/true"], timeout: {timeout}}}\n'
        )

    with cluster(pg_dsn, schema, tmp_path) as running:
        path = running.write_config(
            f"database:\n  url: ${{PGCROND_DATABASE_URL}}\n  schema: {schema}\n"
            f"jobs:\n{jobs('0 5 * * *', '1m')}"
        )
        (replica,) = running.start(path, 1)
        replica.wait_event("daemon_ready", timeout=30)
        # One blank line more: every job moves down a line, which is no change.
        path.write_text(
            f"database:\n  url: ${{PGCROND_DATABASE_URL}}\n  schema: {schema}\n\n"
            f"jobs:\n{jobs('0 6 * * *', '2m')}"
        )
        reloaded = replica.wait_event("config_reloaded", timeout=20)

    assert (["moved", "slower"], [], []) == (
        sorted(reloaded["changed"]), reloaded["added"], reloaded["removed"]
    )  # fmt: skip
    assert {"moved": ["schedule"], "slower": ["timeout"]} == reloaded["changes"]


# -- 9, 10. config errors of cron steps and @reboot --------------------------------------


@pytest.mark.usefixtures("subprocesses")
@pytest.mark.parametrize(
    ("cron", "field", "message"),
    [
        ("*/90 * * * * *", "second", "step 90 in '*/90' is beyond the field's range 0-59"),
        ("*/61 * * * *", "minute", "step 61 in '*/61' is beyond the field's range 0-59"),
        ("0 */25 * * *", "hour", "step 25 in '*/25' is beyond the field's range 0-23"),
    ],
)
def test_check_refuses_a_step_beyond_its_field_naming_file_line_job_and_field(
    cron: str, field: str, message: str, tmp_path: Path
) -> None:
    config = write(
        tmp_path,
        "pgcrond",
        '  ok: {cron: "* * * * *", command: [/bin/true]}\n'
        f'  bad:\n    cron: "{cron}"\n    command: [/bin/true]\n',
    )

    checked = cli(environment("postgresql://app@db/app"), "check", config)

    assert 2 == checked.returncode
    assert "Traceback" not in checked.stderr
    line = checked.stderr.splitlines()[0]
    assert line.startswith(f"{config}:7: job 'bad': field 'cron': {field}: {message}"), line


@pytest.mark.usefixtures("subprocesses")
def test_the_reboot_hint_says_once_true_is_once_per_cluster_ever(tmp_path: Path) -> None:
    config = write(tmp_path, "pgcrond", '  boot: {cron: "@reboot", command: [/bin/true]}\n')

    checked = cli(environment("postgresql://app@db/app"), "check", config)

    assert 2 == checked.returncode
    assert "'once: true' is not per boot either: it runs the job once per cluster, ever" in (
        checked.stderr
    )


# -- 11. history without pgcrond's own rows ----------------------------------------------


@pytest.mark.usefixtures("subprocesses")
def test_history_hides_pgcrond_rows_unless_all_or_asked_for_by_job(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    env = environment(pg_dsn)
    config = write(tmp_path, schema, JOBS)
    assert 0 == cli(env, "migrate", "-c", config).returncode
    for code in ("hello", "pgcrond:catch-up", "pgcrond:prune"):
        add_rows(pg_dsn, schema, code, 2)

    def codes(*extra: str) -> set[str]:
        rows = one_document(cli(env, "history", "-c", config, "-o", "json", *extra))
        return {row["job"] for row in rows}

    text = cli(env, "history", "-c", config)

    assert {"hello"} == codes()
    assert {"hello", "pgcrond:catch-up", "pgcrond:prune"} == codes("--all")
    assert {"pgcrond:prune"} == codes("--job", "pgcrond:prune")
    assert "pgcrond:" not in text.stdout
