"""The docs' generated parts: the benchmark tables, the goals, the README's figures, the module map.

    .venv/bin/python -m bench.docs                  # every table, then everything derived from them
    .venv/bin/python -m bench.docs scale-tick fault # these tables only, then everything derived
    .venv/bin/python -m bench.docs --derived        # no benchmark: goals, README, module map
    .venv/bin/python -m bench.docs --list           # each table and the command that makes it

A table of docs/performance.md sits between ``<!-- figures:begin NAME -->``
and ``<!-- figures:end NAME -->``; the benchmark that makes it rewrites it
with ``--write-docs`` (this command runs each one so), under a header that
names the run's date, the commit measured, the machine and its load. Nothing
between the markers is written by hand. From those tables, and from nothing
else, come the goals table of docs/performance.md and the README's
performance paragraph; the module map of docs/architecture.md comes from the
modules' docstrings. ``tests/test_docs.py`` fails when any of them differs
from what this module makes of the files as they are.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "pgcrond"


@dataclass(frozen=True)
class Table:
    """One generated table: its marker name and the benchmark command that writes it."""

    name: str
    module: str
    args: tuple[str, ...]

    def command(self) -> str:
        return " ".join([".venv/bin/python -m", self.module, *self.args, "--write-docs"])


# Short, honest settings: each window is long enough for its percentiles
# (1,500 runs a side in 30 s), the whole set runs in about a quarter of an hour.
TABLES = (
    Table(
        "side-by-side",
        "bench.side_by_side",
        ("--replicas", "3", "--jobs", "50", "--seconds", "30", "--idle", "60"),
    ),
    Table(
        "fault",
        "bench.side_by_side",
        (
            "--replicas",
            "3",
            "--jobs",
            "50",
            "--seconds",
            "30",
            "--idle",
            "0",
            "--fault",
            "kill-one",
        ),
    ),
    Table("scale-tick", "bench.scale", ("--jobs", "100,1000,10000", "--replicas", "1,3,6")),
    Table("scale-commands", "bench.scale", ("--jobs", "1000", "--replicas", "3", "--commands")),
    Table("scale-hourly", "bench.scale", ("--hourly", "100000", "--replicas", "3", "--ticks", "2")),
    Table("reload", "bench.reload", ("--jobs", "1000,10000")),
    Table("storage", "bench.storage", ()),
)
TABLE_NAMES = tuple(t.name for t in TABLES)


# -- writing a section -----------------------------------------------------------


def markers(section: str) -> tuple[str, str]:
    return f"<!-- figures:begin {section} -->", f"<!-- figures:end {section} -->"


def section_of(text: str, section: str) -> str | None:
    """The text between a section's markers, or None when the file has no such section."""
    begin, end = markers(section)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace_section(text: str, section: str, body: str, where: Path) -> str:
    begin, end = markers(section)
    if begin not in text or end not in text:
        # A table nobody placed is a table nobody reads: say so instead of appending it.
        raise SystemExit(f"{where.relative_to(ROOT)} has no '{begin}' ... '{end}' section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write_section(path: Path, section: str, body: str) -> None:
    path.write_text(replace_section(path.read_text(), section, body, path))
    print(f"# wrote {path.relative_to(ROOT)} ({section})", file=sys.stderr, flush=True)


def write_docs(section: str, body: str) -> None:
    """Replace one table of docs/performance.md (a benchmark's ``--write-docs``)."""
    write_section(PERFORMANCE, section, body)


# -- the header every table carries ----------------------------------------------


def commit() -> str:
    """The commit measured; ``+changes`` when the package or the benchmarks differ from it."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=10", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", "pgcrond", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"{head}+changes" if changed else head


def machine() -> dict[str, str]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {"nproc": str(os.cpu_count()), "cpu": model, "memory": f"{mem_kib / 1024**2:.1f} GiB"}


def versions(dsn: str) -> dict[str, str]:
    import importlib.metadata

    import psycopg

    import pgcrond

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    try:
        peer = importlib.metadata.version("procrastinate")
    except importlib.metadata.PackageNotFoundError:
        peer = "-"
    return {
        "python": platform.python_version(),
        "postgresql": str(row[0] if row else "?"),
        "pgcrond": pgcrond.__version__,
        "procrastinate": peer,
    }


def load_note() -> str:
    one = os.getloadavg()[0]
    note = f"{one:.2f}"
    if one > 1.5:
        note += " (above 1.5: absolute figures are noisy; compare the ratios)"
    return note


def header(dsn: str, command: str, load: str) -> str:
    m, v = machine(), versions(dsn)
    return (
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit()} on {m['nproc']} cores "
        f"({m['cpu']}), {m['memory']} memory; Python {v['python']}, PostgreSQL "
        f"{v['postgresql']}, pgcrond {v['pgcrond']}, procrastinate {v['procrastinate']}. "
        f"Load before the run (1-minute average): {load}.\n\n```sh\n{command}\n```\n"
    )


# -- reading the tables back ----------------------------------------------------------

HEADER = re.compile(r"^Run (\d{4}-\d\d-\d\d \d\d:\d\d) UTC at commit ([0-9a-f]+(?:\+changes)?) ")


@dataclass(frozen=True)
class Figures:
    """One generated table as read back: when and at which commit it ran, and its rows."""

    name: str
    run: str
    commit: str
    rows: tuple[dict[str, str], ...]

    def row(self, **match: str) -> dict[str, str] | None:
        return next((r for r in self.rows if all(r.get(k) == v for k, v in match.items())), None)


def read_tables(text: str) -> dict[str, Figures]:
    tables = {}
    for name in TABLE_NAMES:
        body = section_of(text, name)
        if body is None:
            continue
        found = HEADER.search(body)
        lines = [line for line in body.splitlines() if line.startswith("|")]
        rows: list[dict[str, str]] = []
        if lines:
            columns = [c.strip() for c in lines[0].strip("|").split("|")]
            for line in lines[2:]:
                cells = [c.strip() for c in line.strip("|").split("|")]
                rows.append(dict(zip(columns, cells, strict=True)))
        run, at = (found.group(1), found.group(2)) if found else ("?", "?")
        tables[name] = Figures(name, run, at, tuple(rows))
    return tables


def number(cell: str, index: int = 0) -> float:
    """The index-th number of a cell such as ``1,156 / 2,012 ms`` or ``3.90 s (each …)``."""
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", cell)
    return float(found[index].replace(",", ""))


# -- the goals ------------------------------------------------------------------------

RATIO = "procrastinate ÷ pgcrond"  # the side-by-side tables' ratio column
Check = Callable[[dict[str, Figures]], tuple[str, bool] | None]


def _metric(tables: dict[str, Figures], table: str, metric: str) -> dict[str, str] | None:
    figures = tables.get(table)
    return figures.row(**{"": metric}) if figures else None


def _scale(tables: dict[str, Figures], jobs: str, replicas: str) -> dict[str, str] | None:
    figures = tables.get("scale-tick")
    return figures.row(jobs=jobs, replicas=replicas) if figures else None


def _no_loss(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    side = _metric(tables, "side-by-side", "duplicates / misses")
    scale = tables.get("scale-tick")
    if side is None or scale is None or not scale.rows:
        return None
    lost = [r for r in scale.rows if r["misses / duplicates"] != "0 / 0"]
    shown = f"{side['pgcrond']} side by side; scale: " + (
        "0 / 0 in every row" if not lost else f"{len(lost)} rows with a loss"
    )
    return shown, side["pgcrond"] == "0 / 0" and not lost


def _side(metric: str, index: int, limit: float, unit: str) -> Check:
    def check(tables: dict[str, Figures]) -> tuple[str, bool] | None:
        row = _metric(tables, "side-by-side", metric)
        if row is None:
            return None
        value = number(row["pgcrond"], index)
        return f"{value:,g} {unit}".strip(), value <= limit

    return check


def _cpu(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    row = _metric(tables, "side-by-side", "replica CPU, all replicas (user+sys)")
    if row is None:
        return None
    ratio = number(row[RATIO])
    ours, theirs = number(row["pgcrond"]), number(row["procrastinate"])
    return f"1 / {ratio:.2f} ({ours:,g} s vs {theirs:,g} s)", ratio >= 5


def _rss(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    row = _metric(tables, "side-by-side", "max replica RSS")
    if row is None:
        return None
    ours, theirs = number(row["pgcrond"]), number(row["procrastinate"])
    return f"{ours:,g} MiB vs {theirs:,g} MiB", ours <= min(theirs, 40 * 10**6 / 2**20)


def _fair(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    row = _metric(tables, "side-by-side", "runs per replica")
    if row is None:
        return None
    share = number(row["pgcrond"].split("max", 1)[1])
    return f"{share:,g}× the fair share", share <= 1.5


def _scale_check(
    jobs: str, replicas: str, column: str, index: int, limit: float, unit: str
) -> Check:
    def check(tables: dict[str, Figures]) -> tuple[str, bool] | None:
        row = _scale(tables, jobs, replicas)
        if row is None:
            return None
        value = number(row[column], index)
        return f"{value:,g} {unit}".strip(), value <= limit

    return check


def _ready(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    small, big = _scale(tables, "1,000", "3"), _scale(tables, "10,000", "3")
    if small is None or big is None:
        return None
    one, ten = number(small["start to ready"]), number(big["start to ready"])
    return f"{one:,g} s and {ten:,g} s", one <= 1 and ten <= 3


def _hourly(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    figures = tables.get("scale-hourly")
    row = figures.row(jobs="100,000", replicas="3") if figures else None
    if row is None:
        return None
    ready = max(number(part) for part in row["start to ready"].split("/"))
    rest = max(number(part) for part in row["RSS at rest"].split("/"))
    ticks = row["finished p50 / p99"].split(";")
    p99 = max(number(tick, 1) for tick in ticks)
    lost = sum(number(tick) + number(tick, 1) for tick in row["misses / duplicates"].split(";"))
    shown = f"ready {ready:,g} s; {rest:,g} MiB at rest; p99 {p99:,g} ms; {lost:,g} lost"
    return shown, ready <= 10 and rest <= 300 and p99 <= 1000 and lost == 0


def _commands(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    figures = tables.get("scale-commands")
    row = figures.row(jobs="1,000", replicas="3") if figures else None
    if row is None:
        return None
    value = number(row["finished p50 / p99"], 1)
    return f"{value:,g} ms", value <= 1500


def _reload(tables: dict[str, Figures]) -> tuple[str, bool] | None:
    figures = tables.get("reload")
    rows = [r for r in figures.rows if r["jobs"] == "10,000"] if figures else []
    if not rows:
        return None
    worst = max(number(r["loop time"]) for r in rows)
    return f"{worst:,g} ms (the slower of its two reloads)", worst <= 1000


@dataclass(frozen=True)
class Goal:
    goal: str
    table: str
    check: Check
    bound: str  # what stands in the way when it is missed


GOALS = (
    Goal(
        "0 misses and 0 duplicates, side by side and at every scale",
        "side-by-side, scale-tick",
        _no_loss,
        "",
    ),
    Goal(
        "50 per-second jobs × 3: tick → `run_started` p99 ≤ 10 ms",
        "side-by-side",
        _side("pgcrond only: tick -> run_started p50 / p99", 1, 10, "ms"),
        "[lateness](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "50 per-second jobs × 3: ledger lateness p99 ≤ 25 ms",
        "side-by-side",
        _side("lateness p99", 0, 25, "ms"),
        "[lateness](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "≤ 1.12 database transactions per job-tick, the job's ledger row included",
        "side-by-side",
        _side("db transactions per job-tick, incl. ledger row", 0, 1.12, ""),
        "[transactions](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "≤ 1 statement per replica per minute while idle (3 replicas: ≤ 3)",
        "side-by-side",
        _side("idle: statements per minute (log_statement = all)", 0, 3, ""),
        "",
    ),
    Goal(
        "replica CPU ≤ 1/5 of procrastinate's",
        "side-by-side",
        _cpu,
        "[CPU](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "max RSS ≤ procrastinate's and ≤ 40 MB at 50 jobs",
        "side-by-side",
        _rss,
        "[memory](#what-bounds-the-goals-not-met)",
    ),
    Goal("no replica above 1.5× its fair share", "side-by-side", _fair, ""),
    Goal(
        "10,000 jobs × 1 replica: finished p99 ≤ 3 s",
        "scale-tick",
        _scale_check("10,000", "1", "finished p50 / p99", 1, 3000, "ms"),
        "[a big tick](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "10,000 jobs × 3 replicas: finished p99 ≤ 1 s",
        "scale-tick",
        _scale_check("10,000", "3", "finished p50 / p99", 1, 1000, "ms"),
        "[a big tick](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "1,000 jobs × 3 replicas: finished p99 ≤ 100 ms",
        "scale-tick",
        _scale_check("1,000", "3", "finished p50 / p99", 1, 100, "ms"),
        "[a big tick](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "1,000 commands × 3 replicas: finished p99 ≤ 1.5 s",
        "scale-commands",
        _commands,
        "[commands](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "10,000 × 3: ≤ 3 statements per 500 jobs per replica",
        "scale-tick",
        _scale_check("10,000", "3", "statements (per 500 jobs per replica)", 1, 3, ""),
        "",
    ),
    Goal(
        "10,000 jobs: RSS at rest ≤ 100 MiB",
        "scale-tick",
        _scale_check("10,000", "3", "RSS at rest / after the tick / max", 0, 100, "MiB"),
        "[memory](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "`/metrics` ≤ 50 ms during a 10,000-job tick",
        "scale-tick",
        _scale_check("10,000", "3", "/metrics at rest / during the tick", 1, 50, "ms"),
        "",
    ),
    Goal(
        "no loop turn over 20 ms during a 10,000-job tick",
        "scale-tick",
        _scale_check("10,000", "3", "longest loop stall", 0, 20, "ms"),
        "[a big tick](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "3 replicas starting at once: ready ≤ 1 s at 1,000 jobs, ≤ 3 s at 10,000",
        "scale-tick",
        _ready,
        "[start-up](#what-bounds-the-goals-not-met)",
    ),
    Goal(
        "100,000 hourly jobs × 3: ready ≤ 10 s, ≤ 300 MiB at rest, ticks ≤ 1 s p99, none lost",
        "scale-hourly",
        _hourly,
        "[start-up](#what-bounds-the-goals-not-met)",
    ),
    Goal("a 10,000-job reload ≤ 1 s of loop time", "reload", _reload, ""),
)


def goals_table(tables: dict[str, Figures]) -> str:
    lines = [
        "| goal | measured | table | stands | what bounds it |",
        "|---|---|---|---|---|",
    ]
    for goal in GOALS:
        found = goal.check(tables)
        if found is None:
            lines.append(f"| {goal.goal} | not in the tables | {goal.table} | not measured | |")
            continue
        shown, met = found
        lines.append(
            f"| {goal.goal} | {shown} | {goal.table} | {'met' if met else '**missed**'} "
            f"| {'' if met else goal.bound} |"
        )
    return "\n".join(lines)


# -- the README's paragraph -----------------------------------------------------------


def readme_paragraph(tables: dict[str, Figures]) -> str:
    side, scale = tables.get("side-by-side"), tables.get("scale-tick")
    big = _scale(tables, "10,000", "3")
    if side is None or scale is None or big is None:
        return "The benchmark tables are not generated yet: `python -m bench.docs`."
    lateness = _metric(tables, "side-by-side", "pgcrond only: tick -> run_started p50 / p99")
    ledger = _metric(tables, "side-by-side", "lateness p99")
    own = _metric(tables, "side-by-side", "db transactions per job-tick, own (ledger excluded)")
    cpu = _metric(tables, "side-by-side", "replica CPU, all replicas (user+sys)")
    lost = _metric(tables, "side-by-side", "duplicates / misses")
    assert lateness and ledger and own and cpu and lost
    return (
        f"Three replicas running 50 per-second jobs beside procrastinate on the same "
        f"PostgreSQL (a shared 2-core machine, run {side.run} UTC at `{side.commit}`): "
        f"duplicates / misses {lost['pgcrond']} (procrastinate {lost['procrastinate']}); "
        f"a run starts {number(lateness['pgcrond'], 1):,g} ms p99 after its tick and the "
        f"job's own insert lands {number(ledger['pgcrond']):,g} ms p99 after it "
        f"(procrastinate {number(ledger['procrastinate']):,g} ms); "
        f"{number(own['pgcrond']):,g} own database transactions per job-tick "
        f"(procrastinate {number(own['procrastinate']):,g}); {number(cpu[RATIO]):,g}× less "
        f"replica CPU. One tick of 10,000 per-minute jobs on 3 replicas (run {scale.run} UTC "
        f"at `{scale.commit}`) is finished {number(big['finished p50 / p99'], 1):,g} ms p99 "
        f"after it, with misses / duplicates {big['misses / duplicates']}."
    )


# -- the module map -------------------------------------------------------------------


def summary(path: Path) -> str:
    """A module's docstring up to its first blank line, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    if not doc:
        raise SystemExit(f"{path.relative_to(ROOT)} has no docstring: the module map needs one")
    return " ".join(doc.split("\n\n", 1)[0].split())


def module_map() -> str:
    """Every module and package of pgcrond, each with its docstring's first paragraph."""
    entries: list[tuple[str, str]] = []

    def walk(folder: Path, depth: int) -> None:
        files = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        folders = sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file())
        for path in files:
            entries.append(("  " * depth + path.name, summary(path)))
        for sub in folders:
            entries.append(("  " * depth + sub.name + "/", summary(sub / "__init__.py")))
            walk(sub, depth + 1)

    walk(PACKAGE, 1)
    width = max(len(name) for name, _ in entries) + 2
    lines = ["pgcrond/" + " " * (width - 8) + summary(PACKAGE / "__init__.py")]
    lines += [name.ljust(width) + text for name, text in entries]
    return "```\n" + "\n".join(lines) + "\n```"


# -- the command ----------------------------------------------------------------------


def derived() -> dict[Path, dict[str, str]]:
    """What each file's derived sections should hold, made from the files as they are."""
    tables = read_tables(PERFORMANCE.read_text())
    return {
        PERFORMANCE: {"goals": goals_table(tables)},
        README: {"readme": readme_paragraph(tables)},
        ARCHITECTURE: {"module-map": module_map()},
    }


def write_derived() -> None:
    for path, sections in derived().items():
        for section, body in sections.items():
            write_section(path, section, body)


def run(tables: Sequence[Table]) -> int:
    """Run each table's benchmark; one that fails leaves its table as it was."""
    failed = []
    for table in tables:
        command = [sys.executable, "-m", table.module, *table.args, "--write-docs"]
        print(f"# {table.name}: {table.command()}", file=sys.stderr, flush=True)
        if subprocess.run(command, cwd=ROOT, check=False).returncode != 0:
            failed.append(table.name)
    if failed:
        print(f"# failed, their tables unchanged: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("tables", nargs="*", metavar="TABLE", help=", ".join(TABLE_NAMES))
    parser.add_argument("--derived", action="store_true", help="run no benchmark")
    parser.add_argument("--list", action="store_true", help="print each table's command")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.tables) - set(TABLE_NAMES))
    if unknown:
        parser.error(f"no table {', '.join(unknown)}; the tables: {', '.join(TABLE_NAMES)}")
    if args.list:
        for table in TABLES:
            print(f"{table.name:16} {table.command()}")
        return 0
    failed = 0
    if not args.derived:
        chosen = [t for t in TABLES if not args.tables or t.name in args.tables]
        failed = run(chosen)
    write_derived()
    return failed


if __name__ == "__main__":
    sys.exit(main())
