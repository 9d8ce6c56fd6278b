"""Runs PyTorch's own ProcessGroupGloo tests (``test/distributed/test_c10d_gloo.py``) on "c10drs"
and on Gloo, and compares.

    python run_gloo_tests.py --tests-dir DIR [--backend both|c10drs|gloo] [-k PATTERN ...]
    cargo xtask gloo-tests --tests-dir DIR [-k PATTERN ...]     # builds and installs the wheel first

``DIR`` holds ``test_c10d_gloo.py`` and ``test_c10d_common.py`` from a PyTorch checkout
(``pytorch/test/distributed``), ideally of the installed wheel's commit
(``torch.version.git_version``). They are not in the wheel and not in this repository.

On "c10drs", every ``c10d.ProcessGroupGloo(store, rank, size, opts)`` the tests make becomes a
"c10drs" backend object made the way ``init_process_group`` makes one: our registered creator,
called with a ``_DistributedBackendOptions`` (the store, rank, size, the options' timeout and a
group name that every rank derives alike). Only the name the tests use is replaced
(``torch.distributed.ProcessGroupGloo``): ``init_process_group("gloo")`` inside the tests still
makes PyTorch's Gloo. ``ProcessGroupGloo._Options`` and ``create_device`` stay Gloo's (the
tests build options with them; we read the timeout).

Each backend runs in its own Python process (``MultiProcessTestCase`` spawns its ranks, which
re-import this file and so get the same replacement). The table then lists every test with its
result on both, and the summary counts those that pass on Gloo, split into what this project
answers for and what it does not: Gloo's transport devices (``test_multi_device_constructor``,
``create_device``), its lazy-connection mode (``ProcessGroupGlooLazyInitTest``) and CUDA.
Exit status 0 when every test in scope that passes on Gloo passes on "c10drs".
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from datetime import timedelta
from typing import Any, Dict, List

BACKEND = os.environ.get("C10D_SUITE_BACKEND")
TESTS_DIR = os.environ.get("C10D_SUITE_DIR")

# Out of scope (see the module docs): PyTorch's test names for Gloo's own devices, lazy
# connections and CUDA.
OUT_OF_SCOPE_CLASSES = {"ProcessGroupGlooLazyInitTest"}
OUT_OF_SCOPE_TESTS = {"test_multi_device_constructor", "test_round_robin", "test_round_robin_create_destroy"}


def out_of_scope(test_id: str) -> str:
    """Why a test is not this project's to pass, or ""."""
    cls, _, name = test_id.rpartition(".")
    cls = cls.rpartition(".")[2]
    if cls in OUT_OF_SCOPE_CLASSES:
        return "lazy init"
    if "cuda" in name or "gpu" in name or "nccl" in name:
        return "CUDA"
    if name in OUT_OF_SCOPE_TESTS:
        return "Gloo devices"
    return ""


#: Names the groups the tests make: the n-th of a process is "c10drs_suite_n" on every rank
#: (ranks make their groups in the same order).
_GROUP_NUMBERS = itertools.count(1)


def _timeout_of(opts_or_timeout: Any) -> timedelta:
    if isinstance(opts_or_timeout, timedelta):
        return opts_or_timeout
    t = getattr(opts_or_timeout, "_timeout", None)
    if isinstance(t, timedelta):
        return t
    if isinstance(t, (int, float)):
        return timedelta(seconds=float(t))
    return timedelta(minutes=30)


def _replace_gloo_constructor() -> None:
    import c10d_rs
    import torch._C._distributed_c10d as _c10d
    import torch.distributed as dist

    gloo = dist.ProcessGroupGloo

    class C10dRsInPlaceOfGloo:
        """Stands where the tests call ``ProcessGroupGloo``: makes a "c10drs" backend."""

        _Options = gloo._Options
        create_device = staticmethod(gloo.create_device)
        create_default_device = staticmethod(gloo.create_default_device)

        def __new__(cls, store: Any, rank: int, size: int, opts: Any = None, timeout: Any = None) -> Any:
            o = _c10d._DistributedBackendOptions()
            o.store = store
            o.group_rank = rank
            o.group_size = size
            o.timeout = _timeout_of(timeout if timeout is not None else opts)
            o.group_id = f"c10drs_suite_{next(_GROUP_NUMBERS)}"
            o.global_ranks_in_group = list(range(size))
            return c10d_rs.create_backend(o, None)

    dist.ProcessGroupGloo = C10dRsInPlaceOfGloo  # type: ignore[misc,assignment]


if BACKEND:
    # Worker (and every rank it spawns, which re-imports this file as __mp_main__).
    sys.path.insert(0, TESTS_DIR or ".")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    if BACKEND == "c10drs":
        _replace_gloo_constructor()


class _Recorder(unittest.TextTestResult):
    """Records each test's outcome (pass, fail, error, skip) and the first line of why."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.outcomes: Dict[str, Dict[str, str]] = {}

    def _put(self, test: Any, outcome: str, why: str = "") -> None:
        lines = [ln.strip() for ln in why.strip().splitlines() if ln.strip()]
        errs = [ln for ln in lines if "Error" in ln or "Exception" in ln or "assert" in ln.lower()]
        pick = errs[-1] if errs else (lines[-1] if lines else "")
        self.outcomes[test.id()] = {"outcome": outcome, "why": pick[:300]}

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self._put(test, "pass")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._put(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._put(test, "skip", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._put(test, "pass")

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._put(test, "fail", "unexpected success")


def _selected(suite: unittest.TestSuite, patterns: List[str]) -> unittest.TestSuite:
    out = unittest.TestSuite()
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            out.addTests(_selected(t, patterns))
        elif not patterns or any(p in t.id() for p in patterns):
            out.addTest(t)
    return out


def worker(patterns: List[str], json_out: str) -> int:
    import test_c10d_gloo  # noqa: F401  (from TESTS_DIR)

    suite = _selected(unittest.defaultTestLoader.loadTestsFromName("test_c10d_gloo"), patterns)
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=1, stream=sys.stderr)
    result = runner.run(suite)
    with open(json_out, "w") as f:
        json.dump(result.outcomes, f, indent=1)  # type: ignore[attr-defined]
    return 0


def run_backend(backend: str, tests_dir: str, patterns: List[str]) -> Dict[str, Dict[str, str]]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "results.json")
        env = dict(os.environ, C10D_SUITE_BACKEND=backend, C10D_SUITE_DIR=os.path.abspath(tests_dir))
        cmd = [sys.executable, os.path.abspath(__file__), "--json", out]
        for p in patterns:
            cmd += ["-k", p]
        t0 = time.time()
        subprocess.run(cmd, env=env, check=False)
        print(f"# {backend}: {time.time() - t0:.0f} s", flush=True)
        with open(out) as f:
            return json.load(f)


def compare(results: Dict[str, Dict[str, Dict[str, str]]]) -> int:
    ours, gloo = results.get("c10drs", {}), results.get("gloo", {})
    ids = sorted(set(ours) | set(gloo))
    print(f"\n{'test':<90} {'gloo':<6} {'c10drs':<6} note")
    missing: List[str] = []
    counts = {"gloo_pass": 0, "both_pass": 0, "scope_gloo_pass": 0, "scope_both_pass": 0}
    for i in ids:
        g = gloo.get(i, {}).get("outcome", "-")
        c = ours.get(i, {}).get("outcome", "-")
        why = out_of_scope(i)
        note = f"out of scope: {why}" if why else ""
        if g == "pass":
            counts["gloo_pass"] += 1
            counts["both_pass"] += c == "pass"
            if not why:
                counts["scope_gloo_pass"] += 1
                counts["scope_both_pass"] += c == "pass"
                if c != "pass" and c != "-":
                    missing.append(i)
                    note = ours[i].get("why", "")
        if g not in ("pass", "skip", "-") and not note:
            note = "gloo: " + gloo[i].get("why", "")
        print(f"{i.split('test_c10d_gloo.')[-1]:<90} {g:<6} {c:<6} {note}")
    print(
        f"\n# pass on Gloo: {counts['gloo_pass']}, of which pass on c10drs: {counts['both_pass']}"
        f"\n# in scope (not Gloo devices, lazy init or CUDA): pass on Gloo {counts['scope_gloo_pass']},"
        f" pass on c10drs {counts['scope_both_pass']}"
    )
    if ours and gloo:
        for i in missing:
            print(f"# MISSING on c10drs: {i}: {ours[i].get('why', '')}")
        return 1 if missing else 0
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests-dir", help="directory with test_c10d_gloo.py and test_c10d_common.py")
    ap.add_argument("--backend", choices=["both", "c10drs", "gloo"], default="both")
    ap.add_argument("-k", action="append", default=[], help="run tests whose id contains this")
    ap.add_argument("--json", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if BACKEND:
        return worker(a.k, a.json)
    if not a.tests_dir or not os.path.exists(os.path.join(a.tests_dir, "test_c10d_gloo.py")):
        print(
            "run_gloo_tests: --tests-dir must name a directory holding PyTorch's "
            "test/distributed/test_c10d_gloo.py and test_c10d_common.py (not shipped in the wheel)",
            file=sys.stderr,
        )
        return 2
    backends = ["gloo", "c10drs"] if a.backend == "both" else [a.backend]
    results = {b: run_backend(b, a.tests_dir, a.k) for b in backends}
    return compare(results)


if __name__ == "__main__":
    sys.exit(main())
