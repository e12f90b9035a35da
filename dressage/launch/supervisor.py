"""The parent of every local job: runs it, forwards stop signals, records how it ended.

    python -m dressage.launch.supervisor EXIT_JSON -- python -m dressage.jobs.train ...

:class:`dressage.launch.local.LocalLauncher` starts this in a new session (its own process
group) with stdout/stderr on the job's log. The job may outlive the Airflow task that started it
(a deferred task frees its worker), so nobody would be left to read its exit code: this process
writes it to ``EXIT_JSON`` (atomically) when the job ends, with the state SUCCEEDED, FAILED or
STOPPED (ended after SIGTERM/SIGINT reached the group).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from dressage.commands import command_parser


def write_exit(path: Path, record: dict[str, object]) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(record, sort_keys=True))
    os.replace(scratch, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(
        "python -m dressage.launch.supervisor",
        usage="%(prog)s EXIT_JSON -- COMMAND...",
        description="Run COMMAND, forward stop signals to it, write how it ended to EXIT_JSON.",
    )
    parser.add_argument("exit_json", type=Path, help="where the exit record is written")
    args = list(sys.argv[1:] if argv is None else argv)
    # everything after the first "--" is the job's own command line, never parsed here
    split = args.index("--") if "--" in args else len(args)
    exit_path = parser.parse_args(args[:split]).exit_json
    command = args[split + 1 :]
    if not command:
        parser.error("no COMMAND after --")
    stopping: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)  # usually already delivered to the group; harmless twice

    child: subprocess.Popen[bytes] | None = None
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"dressage supervisor: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        write_exit(exit_path, {"state": "FAILED", "exit_code": 127, "message": str(exc)})
        return 127
    code = child.wait()
    if stopping:
        state, message = "STOPPED", f"stopped by signal {stopping[0]} (exit code {code})"
    elif code == 0:
        state, message = "SUCCEEDED", "exit code 0"
    else:
        state, message = "FAILED", f"exit code {code}"
    write_exit(
        exit_path, {"state": state, "exit_code": code, "message": message, "ended_at": time.time()}
    )
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
