"""The short, seeded form of the fault suite: every invariant holds under every fault.

One run of :mod:`tests.faults.nemesis` (one fault of each kind, shuffled by the
seed, then random ones until ``FAULT_DURATION`` seconds, 45 by default; detached
requests before most faults) against three real replicas and a server of its
own, with entrypoint, command and ``sql:`` jobs; the checker must find no
defect, and no crashed fire in the replicas' logs (the lease's inherent limits,
``checker.INHERENT``, are only reported).
The long form is ``python -m bench.faults --duration 600 --seed N``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faults import checker, nemesis

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("system_processes")]

SEED = int(os.environ.get("FAULT_SEED", "20261201"))
DURATION = float(os.environ.get("FAULT_DURATION", "45"))
# FAULT_REF=HEAD: the replicas run the committed package, not the working tree.
REF = os.environ.get("FAULT_REF") or None


def test_no_invariant_is_violated_under_faults(tmp_path: Path) -> None:
    observations = nemesis.run(DURATION, SEED, tmp_path, progress=print, ref=REF)
    report = observations.check()
    kinds = {fault.kind for fault in report.faults}
    assert set(nemesis.KINDS) == kinds, "every kind of fault was injected"
    assert report.ticks_checked > 0 and report.effects > 0
    assert observations.requests and observations.pauses, "requests and pauses were made"
    assert {r.job for r in observations.ledger} >= {j.code for j in nemesis.JOBS}, "every job ran"
    print(checker.table_text(report))
    explained = []
    for violation in report.examples().values():
        explained.append(json.dumps(violation.as_dict()))
        explained += observations.logs_about(violation.job, violation.run_key, limit=8)
    defects = [v.as_dict() for v in report.violations if v.kind not in checker.INHERENT]
    assert [] == defects, "\n".join(
        [f"seed {SEED}; rows in {tmp_path / 'observations.json'}", *explained]
    )
