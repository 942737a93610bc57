"""The standing fault suite: a TCP proxy, a clock shim, a nemesis and a checker.

Real ``pgcrond run`` replicas reach a real PostgreSQL through :mod:`proxy`
(cut, partition, blackhole), one of them may run under the clock shim
(:mod:`clockshift`), and the nemesis kills, stops and restarts things on a
seeded schedule. Jobs write a ledger straight to the server (ground truth);
:mod:`checker` compares it with the lease table, a pure function over rows.
"""
