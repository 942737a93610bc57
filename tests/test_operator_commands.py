"""The operator's commands name their config one way, describe themselves, complete job codes.

Every command that reads the jobs or the database takes ``-c``, else
``PGCROND_CONFIG``, else ``./pgcrond.yaml``; each subcommand's ``--help`` says
what it does; bash completes job codes from the config; ``pause`` records who
paused when no USER is set; ``manpage --install`` puts the page on man's path.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import subprocess
from pathlib import Path

import pytest

from pgcrond.cli import build_parser, main
from pgcrond.ops.accounting import OPERATOR_ENV, operator
from pgcrond.ops.shell import MANPAGE
from tests.helpers.daemon_harness import PGCROND

# Each command that reads a config, with the arguments it needs besides it.
CONFIG_COMMANDS = {
    "check": [],
    "next": [],
    "calendars": [],
    "run": [],
    "migrate": [],
    "status": [],
    "plan": [],
    "history": [],
    "logs": ["hello"],
    "trigger": ["hello"],
    "unlock": ["hello", "--run-key", "manual:x", "--yes"],
    "prune": [],
    "pause": ["--all"],
    "resume": ["--all"],
    "catch-up": ["--dry-run"],
}
# A field the loader refuses, so that a command that read the file says so, naming it.
BROKEN = "database: {embedded: true}\njobs:\n  hello: {cron: '* * * * *', comand: [id]}\n"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_command_that_takes_a_config_is_listed_here() -> None:
    takes = {name for name, sub in subcommands().items() if any(
        action.dest == "config" for action in sub._actions
    )}  # fmt: skip
    assert set(CONFIG_COMMANDS) == takes


@pytest.mark.parametrize("how", ["-c", "PGCROND_CONFIG", "./pgcrond.yaml"])
def test_every_command_reads_the_config_named_by_c_by_the_environment_or_in_the_directory(
    how: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in (*OPERATOR_ENV, "PGCROND_CONFIG", "PGCROND_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    named = tmp_path / ("pgcrond.yaml" if how == "./pgcrond.yaml" else "jobs.yaml")
    named.write_text(BROKEN)
    given: list[str] = []
    if how == "-c":
        given = ["-c", str(named)]
    elif how == "PGCROND_CONFIG":
        monkeypatch.setenv("PGCROND_CONFIG", str(named))
    said = {}
    for command, extra in CONFIG_COMMANDS.items():
        code = main([command, *given, *extra])
        said[command] = (code, f"{named.name}:3" in capsys.readouterr().err)
    # plan says 1 for an error, as `terraform plan -detailed-exitcode` does; the others 2.
    assert {command: (1 if command == "plan" else 2, True) for command in CONFIG_COMMANDS} == said


def test_a_command_that_needs_the_jobs_says_how_to_name_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PGCROND_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["status"])
    assert 2 == stopped.value.code
    assert (
        "status: give the config: -c PATH, PGCROND_CONFIG=PATH, or a ./pgcrond.yaml"
        in capsys.readouterr().err
    )


def test_every_subcommand_describes_itself_in_its_help() -> None:
    undescribed = [name for name, sub in subcommands().items() if not sub.description]
    assert [] == undescribed


def test_pause_without_user_in_the_environment_records_the_account_as_id_says_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in OPERATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    account = pwd.getpwuid(os.getuid()).pw_name
    assert f"{account} (host:1)" == operator(None, "host:1")
    monkeypatch.setenv("USER", "alice")
    assert "alice (host:1)" == operator(None, "host:1")


def test_manpage_install_puts_the_page_where_man_finds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert 0 == main(["manpage", "--install", str(tmp_path)])
    installed = tmp_path / "man1" / "pgcrond.1"
    assert f"wrote {installed}: read it with `man pgcrond`\n" == capsys.readouterr().out
    assert 0 == main(["manpage"])
    assert capsys.readouterr().out == installed.read_text("utf-8")
    assert MANPAGE.endswith("pgcrond.1")


def complete(words: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """What bash offers for the last of ``words``, through the script `completion bash` prints."""
    script = subprocess.run(
        [str(PGCROND), "completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    line = " ".join(shlex.quote(word) for word in words)
    probe = (
        f"{script}\n"
        f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
        'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}\n'
        "_shtab_pgcrond\n"
        "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, cwd=cwd, env=env, check=True
    )
    return [word for word in done.stdout.splitlines() if word]


@pytest.mark.usefixtures("subprocesses")
def test_bash_completes_job_codes_from_the_config_the_command_line_names(
    tmp_path: Path,
) -> None:
    config = tmp_path / "jobs.yaml"
    config.write_text(
        "database: {embedded: true}\njobs:\n"
        "  hello: {cron: '* * * * *', command: [id]}\n"
        "  help-desk: {cron: '* * * * *', command: [id]}\n"
        "  nightly: {cron: '0 3 * * *', command: [id]}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCROND_")}
    cli = str(PGCROND)
    assert ["hello", "help-desk"] == complete(
        [cli, "trigger", "-c", str(config), "he"], tmp_path, env
    )
    assert ["nightly"] == complete([cli, "history", "-c", str(config), "--job", "n"], tmp_path, env)
    # The config from the environment, and from ./pgcrond.yaml.
    assert ["nightly"] == complete(
        [cli, "logs", "ni"], tmp_path, {**env, "PGCROND_CONFIG": str(config)}
    )
    (tmp_path / "pgcrond.yaml").write_text(config.read_text())
    assert ["hello", "help-desk", "nightly"] == complete([cli, "pause", ""], tmp_path, env)
