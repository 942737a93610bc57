"""``pgcrond plan -c FILE``: what applying FILE changes against what the cluster runs.

The cluster's side is the registry: the job definitions the live replicas
stored (:mod:`pgcrond.storage.registry`), and the open ticks of their jobs.
With no replica live (a deploy that stops them all first), the config the
replica seen last ran; with none ever recorded, the job codes that have
history are known to the cluster, not new. The plan says which it compared
against, and since when.
Exit codes follow ``terraform plan -detailed-exitcode``: 0 nothing to do,
2 changes, 1 error (a bad config, no database, no lease table).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from pgcrond import report
from pgcrond.config.definition import Definition
from pgcrond.config.plan import JobChange, Plan, make_plan
from pgcrond.ops.session import EXIT_OK, Target, run_command
from pgcrond.storage import registry
from pgcrond.storage.history import codes_with_history, open_ticks
from pgcrond.storage.leases import LeaseStore

EXIT_NOTHING = 0
EXIT_FAILED = 1
EXIT_CHANGES = 2
# Open ticks older than this are not counted: they are pruning's (abandoned) already.
OPEN_WITHIN = timedelta(days=7)
_SIGNS = {"added": "+", "removed": "-", "renamed": "~", "changed": "~"}


def plan_command(args: argparse.Namespace) -> int:
    found: list[tuple[Plan, dict[str, Any]]] = []

    async def body(args: argparse.Namespace, target: Target, store: LeaseStore) -> int:
        found.append(await _plan(target, store))
        return EXIT_OK

    # run_command reports its own errors (exit 2 elsewhere); plan says 1, as terraform.
    if run_command(args, body) != EXIT_OK or not found:
        return EXIT_FAILED
    plan, against = found[0]
    print(
        json.dumps(_as_json(plan, against), indent=2, default=str)
        if args.output == "json"
        else _as_text(plan, against)
    )
    return EXIT_CHANGES if plan.has_changes else EXIT_NOTHING


async def _plan(target: Target, store: LeaseStore) -> tuple[Plan, dict[str, Any]]:
    config = target.config
    assert config is not None  # the CLI refuses plan without a config (cli.NEEDS_CONFIG)
    replicas = await registry.live(store, definitions=True)
    against: dict[str, Any] = {"kind": "live"}
    known: list[str] = []
    if not replicas and (last := await registry.last_seen(store)) is not None:
        replicas = [last[0]]
        against = {"kind": "last_seen", "last_seen": last[0].last_seen, "stopped_at": last[1]}
    elif not replicas:
        known = await codes_with_history(store, list(config.jobs))
        against = {"kind": "history", "known": known}
    running: dict[str, list[Definition]] = {}
    for replica in replicas:
        for code, one in (replica.definitions or {}).items():
            if one not in running.setdefault(code, []):
                running[code].append(one)
    codes = sorted(set(running) | set(config.jobs))
    counts: dict[str, int] = {}
    for tick in await open_ticks(store, codes, within=OPEN_WITHIN):
        counts[tick.code] = counts.get(tick.code, 0) + 1
    plan = make_plan(
        config,
        running,
        counts,
        datetime.now(UTC),
        replicas=[r.name for r in replicas],
        config_hashes=sorted({r.config_hash for r in replicas}),
        known=known,
    )
    return plan, against


def _as_json(plan: Plan, against: dict[str, Any]) -> dict[str, Any]:
    return {
        "against": against,
        "replicas": plan.replicas,
        "config_hashes": plan.config_hashes,
        "jobs": [asdict(job) for job in plan.jobs],
        "warnings": plan.warnings,
    }


def _as_text(plan: Plan, against: dict[str, Any]) -> str:
    hashes = ", ".join(h[: report.CONFIG_HASH_SHOWN] for h in plan.config_hashes)
    if against["kind"] == "last_seen":
        stopped = against["stopped_at"]
        ended = (
            f"stopped {report.when(stopped)}"
            if stopped is not None
            else f"last seen {report.when(against['last_seen'])}, not stopped cleanly"
        )
        said = (
            f"no live replica: against config {hashes}, the last one run, by "
            f"{plan.replicas[0]} ({ended})"
        )
    elif against["kind"] == "history":
        said = (
            "no replica recorded a config yet: against the jobs' history "
            f"({len(against['known'])} of these jobs known to the cluster)"
        )
    else:
        said = f"against {len(plan.replicas)} live replica(s) running config {hashes}"
    counts = {kind: sum(1 for j in plan.jobs if j.kind == kind) for kind in _SIGNS}
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no changes"
    lines = [f"Plan: {summary} ({said})."]
    for job in plan.jobs:
        lines += ["", *_job_lines(job)]
    if plan.warnings:
        lines.append("")
        lines += [f"warning: {warning}" for warning in plan.warnings]
    return "\n".join(lines)


def _job_lines(job: JobChange) -> list[str]:
    lines = [f"{_SIGNS[job.kind]} {job.code} ({job.kind})", f"    {job.consequence}"]
    for change in job.changes:
        lines.append(f"    {change.field}: {_shown(change.before)} -> {_shown(change.after)}")
    if job.fires_before is not None and job.kind != "added":
        lines.append(f"    next fires before: {', '.join(job.fires_before) or 'none'}")
    if job.fires_after is not None:
        lines.append(f"    next fires after:  {', '.join(job.fires_after) or 'none'}")
        lines += [
            f"      {fire}  {form}"
            for fire, form in zip(job.fires_after, job.fire_forms or [], strict=False)
        ]
    if job.fires_appearing:
        lines.append(f"    fires appearing:    {', '.join(job.fires_appearing)}")
    if job.fires_disappearing:
        lines.append(f"    fires disappearing: {', '.join(job.fires_disappearing)}")
    if job.fires_skipped:
        skipped = ", ".join(f"{fire} ({why})" for fire, why in job.fires_skipped.items())
        lines.append(f"    recorded SKIPPED:   {skipped}")
    return lines


def _shown(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
