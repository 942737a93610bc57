"""``pgcrond completion SHELL`` and ``pgcrond manpage``: the parser, read by the shell and by man.

Both are generated from :func:`pgcrond.cli.build_parser`, so a new option
completes and is documented without anyone writing it twice. bash and zsh come
from shtab; shtab has no fish, so fish's few ``complete`` lines are written here.
Job codes complete from the config the command line names (``-c``, else
``PGCROND_CONFIG``, else ``./pgcrond.yaml``): the script asks
``pgcrond completion --job-codes WORDS``, which reads the files as YAML
only, without checking them, so a tab press stays fast.
The manual page is generated when the CLI changes (``python -m pgcrond.ops.shell``,
with the test extra's argparse-manpage) and ships in the wheel; ``pgcrond
manpage --install`` puts it where ``man pgcrond`` finds it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from importlib import resources
from pathlib import Path

from pgcrond.errors import ExitCode

MANPAGE = "share/pgcrond.1"

# Options whose values are paths: completed as files in every shell.
PATH_DESTS = ("config", "paths", "path")
# Arguments whose values are job codes: completed from the config.
JOB_DESTS = ("job", "code", "codes")
# Where `manpage --install` puts the page: the first man path directory of the
# user's own (root: the system's local one), as man(1) searches them.
MAN_DIRS = ("~/.local/share/man", "/usr/local/share/man")

# The shell functions that print the job codes, for shtab's `complete` hook.
_JOB_CODES = {
    "bash": "_pgcrond_job_codes",
    "zsh": "_pgcrond_job_codes",
    "preamble": {
        "bash": """
# Job codes of the config this command line names; $1 is the word being completed.
_pgcrond_job_codes() {
  local codes
  codes="$("${COMP_WORDS[0]}" completion --job-codes "${COMP_WORDS[@]}" 2>/dev/null)"
  compgen -W "$codes" -- "$1"
}
""",
        "zsh": """
# Job codes of the config this command line names.
_pgcrond_job_codes() {
  local -a codes
  codes=(${(f)"$(${words[1]} completion --job-codes ${words[@]} 2>/dev/null)"})
  compadd -a codes
}
""",
    },
}


def completion_command(args: argparse.Namespace) -> int:
    if args.job_codes is not None:
        codes = job_codes(args.job_codes)
        sys.stdout.write("".join(f"{code}\n" for code in codes))
        return ExitCode.OK
    if args.shell is None:
        print("pgcrond completion: give the shell: bash, zsh or fish", file=sys.stderr)
        return ExitCode.ERROR
    from pgcrond.cli import build_parser

    sys.stdout.write(completion(build_parser(), args.shell))
    return ExitCode.OK


def job_codes(words: list[str]) -> list[str]:
    """The job codes of the config a command line names, in file order; [] when unreadable."""
    import yaml

    from pgcrond.config.sources import config_paths

    given = []
    for word, after in zip(words, [*words[1:], ""], strict=True):
        if word in ("-c", "--config") and after:
            given.append(after)
        elif word.startswith("--config="):
            given.append(word.removeprefix("--config="))
        elif word.startswith("-c") and len(word) > 2:
            given.append(word[2:])
    files: list[Path] = []
    for raw in config_paths(given):
        path = Path(raw)
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        else:
            files.append(path)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    codes: list[str] = []
    for file in files:
        with contextlib.suppress(OSError, yaml.YAMLError):
            document = yaml.load(file.read_text("utf-8"), Loader=loader)  # noqa: S506 - a safe loader
            jobs = document.get("jobs") if isinstance(document, dict) else None
            if isinstance(jobs, dict):
                codes += [str(code) for code in jobs if str(code) not in codes]
    return codes


def manpage_command(args: argparse.Namespace) -> int:
    text = resources.files("pgcrond").joinpath(MANPAGE).read_text("utf-8")
    if args.install is None:
        sys.stdout.write(text)
        return ExitCode.OK
    root = Path(args.install or MAN_DIRS[os.geteuid() == 0]).expanduser()
    target = root / "man1" / "pgcrond.1"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, "utf-8")
    except OSError as exc:
        print(f"pgcrond manpage: cannot write {target}: {exc.strerror}", file=sys.stderr)
        return ExitCode.ERROR
    print(f"wrote {target}: read it with `man pgcrond`")
    return ExitCode.OK


def completion(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``shell`` (bash, zsh or fish) for ``parser``."""
    if shell == "fish":
        return _fish(parser)
    import shtab

    for sub in [parser, *_commands(parser).values()]:
        for action in sub._actions:
            if action.dest in PATH_DESTS:
                action.complete = shtab.FILE  # type: ignore[attr-defined]
            elif action.dest in JOB_DESTS:
                action.complete = _JOB_CODES  # type: ignore[attr-defined]
    script: str = shtab.complete(parser, shell=shell)
    return script if script.endswith("\n") else script + "\n"


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


_FISH_JOB_CODES = shlex.quote("(pgcrond completion --job-codes (commandline -opc))")


def _fish(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    commands = _commands(parser)
    helps = {
        choice.dest: choice.help or ""
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for choice in action._choices_actions
    }
    lines = [f"# fish completion for {prog}, generated by `{prog} completion fish`"]
    lines.append(f"complete -c {prog} -f")
    for name in commands:
        lines.append(
            f"complete -c {prog} -n __fish_use_subcommand -a {shlex.quote(name)} "
            f"-d {shlex.quote(helps.get(name, ''))}"
        )
    for name, sub in commands.items():
        when = shlex.quote(f"__fish_seen_subcommand_from {name}")
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:
                if action.choices is not None:
                    choices = shlex.quote(" ".join(map(str, action.choices)))
                    lines.append(f"complete -c {prog} -n {when} -a {choices}")
                elif action.dest in PATH_DESTS:
                    lines.append(f"complete -c {prog} -n {when} -F")
                elif action.dest in JOB_DESTS:
                    lines.append(f"complete -c {prog} -n {when} -a {_FISH_JOB_CODES}")
                continue
            flags = []
            for option in action.option_strings:
                flags.append(f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}")
            value = ""
            if action.choices is not None:
                value = " -x -a " + shlex.quote(" ".join(map(str, action.choices)))
            elif action.dest in PATH_DESTS:
                value = " -r -F"
            elif action.dest in JOB_DESTS:
                value = f" -x -a {_FISH_JOB_CODES}"
            elif action.nargs != 0:
                value = " -x"
            lines.append(
                f"complete -c {prog} -n {when} {' '.join(flags)}{value} "
                f"-d {shlex.quote(action.help or '')}"
            )
    return "\n".join(lines) + "\n"


def render_manpage(parser: argparse.ArgumentParser) -> str:
    """The roff manual page of ``parser`` (what ``pgcrond manpage`` prints)."""
    from argparse_manpage.manpage import Manpage

    from pgcrond import __version__

    page = Manpage(
        parser,
        {
            "project_name": "pgcrond",
            "version": __version__,
            "manual_title": "pgcrond manual",
            # The NAME line's "pgcrond - ..." (the parser's description is the DESCRIPTION).
            "description": "distributed cron daemon guarded by PostgreSQL",
        },
    )
    return str(page)


if __name__ == "__main__":
    # Regenerate the shipped page after a CLI change: python -m pgcrond.ops.shell
    from pathlib import Path

    from pgcrond.cli import build_parser

    target = Path(__file__).resolve().parent.parent / MANPAGE
    target.write_text(render_manpage(build_parser()), "utf-8")
    print(f"wrote {target}")
