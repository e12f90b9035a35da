"""Parts 5 and 6: the project's own fuzz, auth-matrix and bad-input tests, run and counted.

One pytest run in its own process group (killed if it outlives its time). Part 5: the two
schema fuzz tests with ``DRESSAGE_FUZZ_SCALE`` (their example counts times the scale); each
writes its cases, 5xx and statuses to ``$FUZZ_REPORT``. Part 6: the auth matrices (each writes
its bad-credential attempts and how many got the 401 to ``$AUTH_REPORT``) and the hand-made
bad-input tests, counted from pytest's JUnit report (a case is one test, which sends one or more
bad requests). ``quick`` runs a slice: the proxy's fuzz test, its auth matrices and two of its
bad-input tests (one model-free process, no second tokenizer or model load).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from .services import REPO

FUZZ = ["tests/proxy/test_proxy_fuzz.py", "tests/engine/test_engine_fuzz.py"]
AUTH = ["tests/proxy/test_proxy_auth.py", "tests/engine/test_engine_auth.py"]
BAD_INPUT = [
    "tests/proxy/test_proxy_hostile_input.py",
    "tests/proxy/test_proxy_bad_input.py",
    "tests/proxy/test_proxy_input_limits.py",
    "tests/engine/test_engine_bad_input.py",
]
QUICK = (FUZZ[:1], AUTH[:1] + BAD_INPUT[:1])
"""The smoke run's files for parts 5 and 6, and its slice of them."""
QUICK_SELECTION = "fuzz or admin_routes or chat_routes or lone_surrogate or deeply_nested"
TIMEOUT_S = 3600.0


class Suites:
    """The pytest run of the parts asked for: ``start()``, then ``result()``."""

    def __init__(self, workdir: Path, parts: list[str], *, fuzz_scale: float, quick: bool) -> None:
        self.workdir, self.parts = workdir, parts
        fuzz, others = QUICK if quick else (FUZZ, AUTH + BAD_INPUT)
        self.files = (fuzz if "fuzz" in parts else []) + (others if "suites" in parts else [])
        self.junit = workdir / "pytest.xml"
        self.log = workdir / "pytest.log"
        self.fuzz_report, self.auth_report = workdir / "fuzz.json", workdir / "auth.json"
        self.argv = [
            sys.executable,
            "-m",
            "pytest",
            *self.files,
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            f"--junitxml={self.junit}",
        ]
        if quick:
            self.argv += ["-k", QUICK_SELECTION]
        self.env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            DRESSAGE_FUZZ_SCALE=str(fuzz_scale),
            FUZZ_REPORT=str(self.fuzz_report),
            AUTH_REPORT=str(self.auth_report),
        )
        self.fuzz_scale = fuzz_scale
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        if not self.files:
            return
        self.started = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def ran(self, files: list[str]) -> list[str]:
        return [f for f in files if f in self.files]

    def stop(self) -> None:
        """Kill the run's process group if it is still going (no strays)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _wait(self) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - self.started)))
        finally:
            self.stop()

    def result(self) -> dict[str, Any]:
        """The figures of parts 5 and 6 (those asked for), once pytest has ended."""
        if self.proc is None:
            return {}
        code = self._wait()
        seconds = round(time.monotonic() - self.started, 1)
        cases: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        if self.junit.exists():
            for case in ET.parse(self.junit).getroot().iter("testcase"):
                path = case.get("classname", "").replace(".", "/") + ".py"
                cases[path] += 1
                failed[path] += any(c.tag in ("failure", "error") for c in case)
        lines = self.log.read_text("utf-8", "replace").strip().splitlines()
        run = {"exit_code": code, "seconds": seconds, "summary": lines[-1] if lines else ""}
        out: dict[str, Any] = {}
        if "fuzz" in self.parts:
            services = _read(self.fuzz_report)
            out["fuzz"] = {
                "scale": self.fuzz_scale,
                "cases": sum(s["cases"] for s in services.values()),
                "5xx": sum(s["5xx"] for s in services.values()),
                "services": services,
                "tests": {**run, **_count(self.ran(FUZZ), cases, failed)},
            }
        if "suites" in self.parts:
            matrices = _read(self.auth_report)
            out["suites"] = {
                "bad_credential_attempts": sum(m["attempts"] for m in matrices.values()),
                "bad_credentials_refused": sum(m["refused"] for m in matrices.values()),
                "auth_matrices": matrices,
                "bad_input_cases": sum(cases[f] for f in BAD_INPUT),
                "tests": {**run, **_count(self.ran(AUTH + BAD_INPUT), cases, failed)},
            }
        return out


def _read(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _count(files: list[str], cases: Counter[str], failed: Counter[str]) -> dict[str, Any]:
    """These files' cases, failures, and cases per file."""
    return {
        "cases": sum(cases[f] for f in files),
        "failed": sum(failed[f] for f in files),
        "per_file": {f: cases[f] for f in files},
    }
