"""Command-line parsing only: each command calls one function elsewhere.

Handlers are imported lazily so that ``pgcrond --help`` and ``pgcrond check``
stay fast and never import the database driver.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

DESCRIPTION = """\
pgcrond runs cron jobs on N replicas and lets PostgreSQL decide which replica
runs each tick: every replica fires every tick, one claim wins, the others skip.
"""

EPILOG = """\
examples:
  pgcrond check -c config/example.yaml          validate a config and list its jobs
  pgcrond check - < jobs.yaml                   validate a config read from stdin
  pgcrond next -c config/ -n 5 --job nightly    the next 5 fire times of one job
  pgcrond run -c config/example.yaml            run the daemon
  pgcrond status -c config/                     what runs, what ran, what failed
  pgcrond history --job nightly --status FAIL   past failures of one job
  pgcrond logs nightly                          what its newest attempt printed
  pgcrond trigger nightly                       run it now on the cluster, wait for it
  pgcrond backfill nightly --from 2026-11-24 --to 2026-11-30 --dry-run
                                                what re-running last week's ticks would run
  pgcrond init && pgcrond check pgcrond.yaml    start a config from a commented template

output:
  -o text|wide|json on every command that prints (--json = -o json): one JSON
  document on stdout; `pgcrond completion bash|zsh|fish`, `pgcrond manpage`

exit codes:
  0 done, 1 ran but not done, 2 error (one line on stderr), 3 not run here
  (trigger, backfill, catch-up), 130 run stopped by a second SIGINT, 141 stdout closed

environment:
  PGCROND_CONFIG         the config when no -c is given (PATH[:PATH...]); without
                         either, ./pgcrond.yaml when it exists
  PGCROND_DATABASE_URL   database URL; overrides database.url in the config
  PGCROND_REPLICA        run: this replica's name, like --replica
  NO_COLOR               set (not empty): no colour in log lines unless --color always
"""

# command name -> "module:function"; each function takes the parsed namespace
# and returns the process exit code.
HANDLERS: dict[str, str] = {
    "check": "pgcrond.ops.inspect:check_command",
    "schema": "pgcrond.ops.inspect:schema_command",
    "next": "pgcrond.ops.inspect:next_command",
    "calendars": "pgcrond.ops.inspect:calendars_command",
    "run": "pgcrond.daemon.command:run_command",
    "migrate": "pgcrond.ops.commands:migrate_command",
    "status": "pgcrond.ops.commands:status_command",
    "plan": "pgcrond.ops.plan:plan_command",
    "history": "pgcrond.ops.commands:history_command",
    "logs": "pgcrond.ops.attempts:logs_command",
    "trigger": "pgcrond.ops.trigger:trigger_command",
    "backfill": "pgcrond.ops.backfill:backfill_command",
    "unlock": "pgcrond.ops.unlock:unlock_command",
    "prune": "pgcrond.ops.prune:prune_command",
    "pause": "pgcrond.ops.accounting:pause_command",
    "resume": "pgcrond.ops.accounting:resume_command",
    "catch-up": "pgcrond.ops.accounting:catch_up_command",
    "init": "pgcrond.ops.starter:init_command",
    "completion": "pgcrond.ops.shell:completion_command",
    "manpage": "pgcrond.ops.shell:manpage_command",
    "hash-password": "pgcrond.ops.passwords:hash_password_command",
}


# Commands that cannot work without the jobs; the others fall back to a
# database URL when no config is named.
NEEDS_CONFIG = frozenset(
    {"check", "next", "calendars", "run", "status", "plan", "trigger", "backfill", "catch-up"}
)


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        dest="config",
        action="append",
        metavar="PATH",
        help="a YAML file or a directory of *.yaml files (repeatable; default: "
        "PGCROND_CONFIG, else ./pgcrond.yaml when it exists)",
    )


def _add_paths(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="config files or directories, like -c"
    )


def _add_database(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL; overrides PGCROND_DATABASE_URL and database.url",
    )


def _replica(text: str) -> str:
    from pgcrond.core.replica import check_name
    from pgcrond.errors import ValidationError

    try:
        return check_name(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{exc.field}: ")) from None


def _listen(text: str) -> str:
    """``--http`` read by the same parser as ``http.listen``, so `run` refuses what `check` does."""
    from pgcrond.config.listen import parse_listen
    from pgcrond.errors import ValidationError

    try:
        parse_listen(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{exc.field}: ")) from None
    return text


def _add_output(parser: argparse.ArgumentParser, wide: str = "as text") -> None:
    """One convention for every command that prints: ``-o text|wide|json``, ``--json`` kept."""
    parser.add_argument(
        "-o",
        "--output",
        choices=["text", "wide", "json"],
        default="text",
        help=f"text (default), wide ({wide}), or json: one JSON document on stdout",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="the same as -o json"
    )


def _add_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="a parameter: an environment variable for this run only (repeatable); recorded "
        "with the request and shown by history and logs (*** if the name looks secret); the "
        "job's params: lists the names it accepts",
    )


def _add_concurrency(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        metavar="POLICY",
        help="the overlap policy for this run instead of the job's: forbid, allow, replace, "
        "buffer_one, or N (allow, at most N at once)",
    )


def _add_logging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        default="auto",
        help="log line format (default: console on a terminal, JSON otherwise)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="lowest level logged (default: info)",
    )
    parser.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour console log lines (default: auto, on a terminal unless NO_COLOR is set)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgcrond",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from pgcrond import __version__

    parser.add_argument("--version", action="version", version=f"pgcrond {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    check = sub.add_parser(
        "check",
        help="validate config files and list their jobs",
        description="Validate config files (PATH '-' reads stdin) and list their jobs. An unset "
        "${VAR} is a warning, so a config can be linted without its secrets; --strict makes it "
        "an error. Exit 0: valid; 2: not.",
    )
    _add_config(check)
    _add_paths(check)
    _add_output(check)
    check.add_argument(
        "--strict", action="store_true", help="an unset ${VAR} is an error, as for `run`"
    )
    check.add_argument(
        "--explain",
        action="store_true",
        help="also say how each job is boxed on this machine: its user, its limits and "
        "how they are enforced here (cgroup or rlimits), what it inherits",
    )

    sub.add_parser(
        "schema",
        help="print the JSON Schema of the config files",
        description="Print the JSON Schema of pgcrond's YAML (docs/config.schema.json), "
        "generated from the field table the loader itself reads.",
    )

    nxt = sub.add_parser(
        "next",
        help="print the next fire times of each job",
        description="Print the next N ticks of each job, as the daemon computes them: the run "
        "key, the local time in the job's zone (daylight-saving shifts included) and, with "
        "jitter, where the daemon fires it. Reads the config only: no database.",
    )
    _add_config(nxt)
    _add_paths(nxt)
    nxt.add_argument("--job", metavar="CODE", help="only this job")
    nxt.add_argument("-n", type=int, default=5, metavar="N", help="how many (default: 5)")
    nxt.add_argument("--from", dest="start", metavar="ISO", help="start after this instant")
    _add_output(nxt)

    days_off = sub.add_parser(
        "calendars",
        help="print the days to come of each calendar",
        description="Print the days to come of each calendar of the config (the days its "
        "jobs' ticks are skipped on, recorded SKIPPED/calendar:<name>). Reads the config "
        "only: no database.",
    )
    _add_config(days_off)
    _add_paths(days_off)
    days_off.add_argument("--from", dest="start", metavar="DATE", help="from this day (today)")
    days_off.add_argument("--days", type=int, default=90, metavar="N", help="how many (90)")
    _add_output(days_off)

    run = sub.add_parser(
        "run",
        help="run the daemon (one replica)",
        description="Run one replica: fire every job's ticks, claim each through its guard, "
        "run the ones won. SIGTERM/SIGINT drain (running jobs get shutdown_grace; exit 0), a "
        "second SIGINT stops at once (exit 130), SIGHUP reloads the config (a bad one is "
        "rejected).",
    )
    _add_config(run)
    _add_database(run)
    run.add_argument(
        "--http",
        type=_listen,
        metavar="HOST:PORT",
        help="address of /healthz, /readyz and /metrics; empty to turn off "
        "(default: http.listen in the config, else 127.0.0.1:9464)",
    )
    run.add_argument(
        "--replica",
        type=_replica,
        metavar="NAME",
        help="this replica's name in the lease table, status and hooks (default: "
        "PGCROND_REPLICA, else HOSTNAME:pid in Kubernetes, else host:pid-RANDOM)",
    )
    _add_logging(run)

    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade the lease table",
        description="Create the lease table and its companions (schema, requests, job "
        "state, registry, attempts) or apply the migrations it lacks; safe while replicas "
        "run, and what every replica does at start. Exit 0: up to date.",
    )
    _add_config(migrate)
    _add_database(migrate)
    _add_output(migrate)

    status = sub.add_parser(
        "status",
        help="one row per job: next fire, last run, running now",
        description="One row per job, 7 columns that fit 100 characters: JOB, SCHEDULE, GUARD, "
        "NEXT FIRE, LAST RUN, RUNNING, FAILS, then the live replicas and their drift. -o wide "
        "adds where and how long, the last tick, success and failure, misses in 24 h and the "
        "pause; -o json has all of it, with the pauses and the problems --check judges.",
    )
    _add_config(status)
    _add_database(status)
    _add_output(status, wide="times, owners, last tick, success, failure, misses, pause")
    status.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when something needs a look, like `systemctl is-active`: no live "
        "replica, drift for over 15 minutes, a job whose last run failed, a stale job "
        "(alert_after); 0 when healthy, 2 when it could not tell (no database)",
    )

    plan = sub.add_parser(
        "plan",
        help="what applying a config changes against what the live replicas run "
        "(exit 0: nothing, 2: changes, 1: error)",
        description="Compare a config with what the cluster runs: the live replicas' "
        "configs from the registry, else (every replica stopped) the config the replica seen "
        "last ran, else the job codes with history. Each job added, removed, renamed or "
        "changed, with what follows from it (next fires before and after a schedule "
        "change, open ticks under a guard change). Exit 0: nothing to do; 2: changes; "
        "1: error.",
    )
    _add_config(plan)
    _add_database(plan)
    _add_output(plan)

    history = sub.add_parser(
        "history",
        help="past runs, newest first",
        description="Past runs from the lease table, newest first: one row per tick (or "
        "manual run) with its status, attempt, owner, start and duration, and under a tick "
        "that needed more than one attempt or did not succeed a row per attempt with the "
        "last line it printed (`pgcrond logs` has all it kept).",
    )
    _add_config(history)
    _add_database(history)
    history.add_argument("--job", metavar="CODE", help="only this job")
    history.add_argument("--since", metavar="ISO|DURATION", help="e.g. 2026-11-30T00:00Z or 24h")
    history.add_argument(
        "--status",
        choices=["RUNNING", "SUCCESS", "FAIL", "SKIPPED", "MISSED"],
        help="only this status",
    )
    history.add_argument("--limit", type=int, default=50, metavar="N", help="default: 50")
    history.add_argument(
        "--all",
        action="store_true",
        help="also pgcrond's own rows (pgcrond:catch-up, pgcrond:prune), hidden by default",
    )
    _add_output(history)

    logs = sub.add_parser(
        "logs",
        help="what an attempt printed: the kept head and tail of its stdout and stderr",
        description="Print an attempt's output as its attempt record keeps it: the first "
        "2 KiB and last 16 KiB of each stream (how much was dropped between them is "
        "said), redacted, with control characters and invalid UTF-8 escaped. A failed "
        "attempt shows stderr first. Default: the job's newest attempt.",
    )
    _add_config(logs)
    _add_database(logs)
    logs.add_argument("job", metavar="CODE", help="the job")
    logs.add_argument(
        "--run-key", metavar="K", help="this tick (or manual run); default: the newest"
    )
    logs.add_argument(
        "--attempt", type=int, metavar="N", help="this attempt of it; default: the newest"
    )
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="if the attempt is still running, wait for it to end, then print its output "
        "(it cannot be streamed from here: the output is stored when the attempt ends; "
        "the replica running it streams it to its own log as job_output events)",
    )
    _add_output(logs)

    trigger = sub.add_parser(
        "trigger",
        help="run a job now, once across the cluster, and wait for its outcome",
        description="Run a job now on the cluster: record a request that one daemon replica "
        "takes and runs through the job's guard (where the jobs run, as the schedule would), "
        "follow it (taken, run_started, outcome; the kept output tail when it fails) and exit "
        "with its result. Exit 0: it ran and succeeded; 1: it ran and failed; 3: it did not "
        "run (the run key runs or ran elsewhere, or no live replica runs the job). "
        "--no-wait: exit 0 once requested. --here: run it in this process instead.",
    )
    _add_config(trigger)
    _add_database(trigger)
    trigger.add_argument("code", metavar="CODE")
    trigger.add_argument(
        "--run-key",
        metavar="KEY",
        help="default: manual:<current UTC minute>, so shells triggering at once run it once",
    )
    _add_env(trigger)
    _add_concurrency(trigger)
    where = trigger.add_mutually_exclusive_group()
    where.add_argument(
        "--no-wait",
        "--detach",
        dest="no_wait",
        action="store_true",
        help="record the request, print the run key and exit 0 at once (see the outcome "
        "with `pgcrond history --job CODE`)",
    )
    where.add_argument(
        "--here",
        action="store_true",
        help="run it in THIS process, on this machine, as this user, through the guard, "
        "its output and log lines in this terminal (not on a replica)",
    )
    _add_output(trigger)
    _add_logging(trigger)

    backfill = sub.add_parser(
        "backfill",
        help="run a job's past ticks in a range again on the cluster, skipping what succeeded",
        description="Run the job's scheduled ticks from --from to --to (both included) again "
        "on the cluster, each under its own run key: a tick that succeeded is not run again, "
        "one that failed for good, was missed or has no record is. --dry-run lists each tick "
        "with what would be done and why, and files nothing. Otherwise the ticks are filed as "
        "requests the daemon replicas take, at most --max-parallel at a time, in tick order, "
        "through the job's guard (pause and the overlap policy apply); the command says on "
        "stderr how many are done, running and left, then prints what each tick came to. "
        "Exit 0: every tick it ran succeeded (or there was nothing to run); 1: one failed; "
        "3: one was not run (or no live replica runs the job). --no-wait: exit 0 once filed.",
    )
    _add_config(backfill)
    _add_database(backfill)
    backfill.add_argument("code", metavar="CODE")
    backfill.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="T1",
        help="the first instant of the range: an ISO-8601 date or instant, UTC unless it "
        "has an offset (2026-11-24, 2026-11-24T03:00:00+01:00)",
    )
    backfill.add_argument(
        "--to",
        dest="end",
        required=True,
        metavar="T2",
        help="the last instant of the range (included; not in the future)",
    )
    backfill.add_argument(
        "--dry-run",
        action="store_true",
        help="list each tick of the range: run or skip, and why; file nothing",
    )
    backfill.add_argument(
        "--max-parallel",
        type=int,
        default=1,
        metavar="N",
        help="at most N of its ticks run at once across the cluster (default: 1, one after "
        "the other)",
    )
    _add_env(backfill)
    _add_concurrency(backfill)
    backfill.add_argument(
        "--no-wait",
        "--detach",
        dest="no_wait",
        action="store_true",
        help="file the backfill and exit 0 (it goes on: see `pgcrond status`)",
    )
    _add_output(backfill)
    _add_logging(backfill)

    unlock = sub.add_parser(
        "unlock",
        help="release a stuck run, or allow a run-once job again",
        description="Release one lease row by hand: a RUNNING tick whose replica is gone "
        "(so that a replica may claim it again), or a run-once job's INITIAL row (so that "
        "it runs once more at the next start). Shows the row and asks first; a finished "
        "tick is history and is not released (run the job again with `pgcrond trigger`).",
    )
    _add_config(unlock)
    _add_database(unlock)
    unlock.add_argument("code", metavar="CODE")
    which = unlock.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-key", metavar="KEY", help="the tick to release")
    which.add_argument("--initial", action="store_true", help="the run-once (INITIAL) row")
    unlock.add_argument(
        "--yes", action="store_true", help="do not ask for confirmation (needed with -o json)"
    )
    _add_output(unlock)

    prune = sub.add_parser(
        "prune",
        help="delete finished runs older than history_retention",
        description="Delete finished ticks and done requests older than history_retention "
        "(or a job's own), in small batches; running ticks and run-once (INITIAL) rows are "
        "kept. Replicas prune on their own as well.",
    )
    _add_config(prune)
    _add_database(prune)
    prune.add_argument("--older-than", metavar="DURATION", help="default: history_retention")
    _add_output(prune)

    for name, verb in (("pause", "pause"), ("resume", "resume")):
        state = sub.add_parser(
            name,
            help=f"{verb} jobs across the cluster (no reload)",
            description="Pause jobs cluster-wide: every replica's next claim reads the pause "
            "and records the tick SKIPPED/paused (who, when, why); manual runs still go. "
            "Resume lets the next tick run."
            if name == "pause"
            else "Resume paused jobs: the next tick of each runs again.",
        )
        _add_config(state)
        _add_database(state)
        state.add_argument("codes", nargs="*", metavar="CODE")
        state.add_argument("--all", action="store_true", help=f"{verb} every job")
        if name == "pause":
            state.add_argument("--reason", metavar="TEXT", help="why, shown with every skip")
        state.add_argument(
            "--by",
            metavar="NAME",
            help=f"who {verb}s, recorded beside this host:pid (default: the operator, "
            "from SUDO_USER, USER or LOGNAME, else this process's user, as `id -un`)",
        )
        _add_output(state)

    catch_up = sub.add_parser(
        "catch-up",
        help="record or run the ticks no replica ran (what a starting replica does)",
        description="Find each lease job's expected ticks after its newest record (within "
        "catch_up_window) and record them MISSED or run them by the job's catch_up policy, "
        "once, then exit. --dry-run prints the plan and changes nothing.",
    )
    _add_config(catch_up)
    _add_database(catch_up)
    catch_up.add_argument("--dry-run", action="store_true", help="print the plan only")
    _add_output(catch_up)
    _add_logging(catch_up)

    init = sub.add_parser(
        "init",
        help="write a commented starter config",
        description="Write a commented starter config that `pgcrond check` accepts: one lease "
        "job, one advisory job, the database from PGCROND_DATABASE_URL. Refuses to overwrite "
        "an existing file without --force. Exit 0: written; 2: not.",
    )
    init.add_argument(
        "path", nargs="?", default="pgcrond.yaml", metavar="PATH",
        help="where to write it (default: pgcrond.yaml; '-' prints it)",
    )  # fmt: skip
    init.add_argument("--force", action="store_true", help="overwrite an existing file")

    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print the completion script of bash, zsh or fish, generated from this "
        "parser. Install: see docs/operations.md (e.g. `pgcrond completion bash > "
        "~/.local/share/bash-completion/completions/pgcrond`).",
    )
    completion.add_argument("shell", nargs="?", choices=["bash", "zsh", "fish"])
    # What the scripts call to complete job codes: the command line, after --.
    completion.add_argument("--job-codes", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    manpage = sub.add_parser(
        "manpage",
        help="print or install the manual page (roff)",
        description="Print pgcrond(1), the manual page shipped in the package (read it with "
        "`pgcrond manpage | man -l -`), or install it where `man pgcrond` finds it.",
    )
    manpage.add_argument(
        "--install",
        nargs="?",
        const="",
        metavar="DIR",
        help="write DIR/man1/pgcrond.1 (default DIR: ~/.local/share/man, as root "
        "/usr/local/share/man)",
    )

    hash_password = sub.add_parser(
        "hash-password",
        help="print the hash of a status page user's password (for http.users)",
        description="Read a password (from the terminal, twice, or --stdin) and print its "
        "scrypt hash, for http.users in the config; the password itself is never stored.",
    )
    hash_password.add_argument(
        "--stdin", action="store_true", help="read the password from the first line of stdin"
    )

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "config"):
        from pgcrond.config.sources import CONFIG_ENV, CONFIG_HERE, config_paths

        # `pgcrond check FILE` reads as naturally as `pgcrond check -c FILE`.
        args.config = config_paths([*(args.config or []), *getattr(args, "paths", [])])
        if not args.config and args.command in NEEDS_CONFIG:
            parser.error(
                f"{args.command}: give the config: -c PATH, {CONFIG_ENV}=PATH, or a ./{CONFIG_HERE}"
            )
    module_name, function_name = HANDLERS[args.command].split(":")
    handler = getattr(importlib.import_module(module_name), function_name)
    try:
        code: int = handler(args)
        # Buffered output meets a closed pipe here, not at exit where it could not be caught.
        sys.stdout.flush()
    except BrokenPipeError:
        return _pipe_closed()
    return int(code)


def _pipe_closed() -> int:
    """The reader left (``| head -1``): exit quietly, as the Python docs' recipe does.

    stdout is pointed at /dev/null so that the interpreter's flush at exit finds
    nowhere to fail and prints no second traceback.
    """
    from pgcrond.errors import ExitCode

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
