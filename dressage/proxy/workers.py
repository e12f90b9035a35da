"""The worker processes of ``dressage-proxy --workers N``: their stores, start, restart and stop.

Each worker is a whole proxy, :func:`dressage.proxy.server.main` run with the front's own flags
but bound to a free loopback port and with its store in ``STORE_DIR/worker-K``; it replays that
store on every start exactly as a lone proxy does. Workers are started as

    python -m dressage.proxy.workers --parent PID --index K -- <the front's flags> ...

which first asks Linux to send the worker SIGTERM when its parent dies (``PR_SET_PDEATHSIG``),
so ``kill -9`` of the front leaves no orphans. A worker is ready once it prints its
``DRESSAGE_PROXY_URL=`` line (:data:`~dressage.proxy.server.READY_PREFIX`).

Session ids hash to workers (:func:`worker_of`: BLAKE2b of the id's UTF-8, modulo N), so the
mapping holds across restarts but changes with N: ``STORE_DIR/workers.json`` records the N a
store was written with, and :func:`store_layout_error` refuses to start with another one (a
store written by one process, ``STORE_DIR/trajectory.log``, counts as N = 1).
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

__all__ = [
    "WORKERS_FILE",
    "Worker",
    "WorkerFailed",
    "Workers",
    "claim_store",
    "store_layout_error",
    "worker_argv",
    "worker_of",
    "worker_store",
]

log = logging.getLogger(__name__)
WORKERS_FILE = "workers.json"
"""In a store folder written by several workers: ``{"workers": N}``."""
_PR_SET_PDEATHSIG = 1
_RESTART_DELAYS_S = (0.2, 1.0, 5.0)
"""Waits before restarting a worker that died, the last repeated while it keeps dying at once."""
_STOP_GRACE_S = 20.0


class WorkerFailed(RuntimeError):
    """A worker exited before it was ready, or with the status of a refusal (2)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def worker_of(session_id: str, workers: int) -> int:
    """The worker of ``session_id`` among ``workers``: stable across processes and restarts."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % workers


def worker_store(store_dir: Path, index: int) -> Path:
    return store_dir / f"worker-{index}"


def _written_with(store_dir: Path) -> int | None:
    marker = store_dir / WORKERS_FILE
    if marker.exists():
        try:
            return int(json.loads(marker.read_text())["workers"])
        except (ValueError, KeyError, TypeError):
            return -1
    if (store_dir / "trajectory.log").exists():
        return 1
    return None


def store_layout_error(store_dir: Path, workers: int) -> str | None:
    """The sentence refusing to serve ``store_dir`` with ``workers`` processes, or None."""
    written = _written_with(store_dir)
    if written is None or written == workers:
        return None
    if written < 0:
        return f"{store_dir / WORKERS_FILE} cannot be read: give a new --store-dir"
    return (
        f"the store {store_dir} was written by {written} proxy process(es) and each session "
        f"lives in the store of the process its id hashes to, so --workers {workers} would send "
        f"sessions to stores that do not hold them: start with --workers {written}, or give a "
        "new --store-dir"
    )


def claim_store(store_dir: Path, workers: int) -> None:
    """Record that ``store_dir`` is written by ``workers`` processes (after the layout check)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    marker = store_dir / WORKERS_FILE
    if not marker.exists():
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"workers": workers}) + "\n")
        os.replace(tmp, marker)


def worker_argv(front_argv: Sequence[str], index: int, store_dir: Path) -> list[str]:
    """The command of worker ``index``: the front's flags, then what a worker overrides (argparse
    keeps the last of a repeated flag)."""
    return [
        sys.executable, "-m", "dressage.proxy.workers", "--parent", str(os.getpid()),
        "--index", str(index), "--", *front_argv, "--workers", "1", "--host", "127.0.0.1",
        "--port", "0", "--store-dir", str(worker_store(store_dir, index)),
    ]  # fmt: skip


class Worker:
    """One worker process and the URL it serves on (None while it is not serving: the front
    routes to it only once :attr:`url` is set, after a restarted worker has caught up)."""

    def __init__(self, index: int, argv: list[str]) -> None:
        self.index = index
        self.argv = argv
        self.process: asyncio.subprocess.Process | None = None
        self.url: str | None = None
        self.started_url = ""
        self.host = "127.0.0.1"
        self.port = 0

    async def start(self) -> None:
        """Start the process and wait for its ready line; WorkerFailed if it exits first."""
        env = dict(os.environ, DRESSAGE_PROXY_WORKERS="1")
        # its own session: a terminal's Ctrl-C reaches the front only, which stops the workers
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        from dressage.proxy.server import READY_PREFIX

        prefix = READY_PREFIX.encode()
        while line := await self.process.stdout.readline():
            if line.startswith(prefix):
                self.started_url = line[len(prefix) :].decode().strip()
                self.port = int(self.started_url.rsplit(":", 1)[1])
                asyncio.get_running_loop().create_task(self._drain(self.process.stdout))
                return
        status = await self.process.wait()
        raise WorkerFailed(f"proxy worker {self.index} exited with status {status}", status)

    @staticmethod
    async def _drain(stdout: asyncio.StreamReader) -> None:
        while await stdout.readline():
            pass

    async def stop(self) -> None:
        process, self.url = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        except TimeoutError:
            process.kill()
            await process.wait()


class Workers:
    """The N workers: started together, each restarted when it dies (a refusal, exit status 2,
    stops them all: it would refuse again)."""

    def __init__(
        self,
        front_argv: Sequence[str],
        store_dir: Path,
        count: int,
        on_restart: Callable[[Worker], Awaitable[None]] | None = None,
    ) -> None:
        self.all = [Worker(k, worker_argv(front_argv, k, store_dir)) for k in range(count)]
        self.stopping = False
        self.failed: asyncio.Future[WorkerFailed] = asyncio.get_running_loop().create_future()
        self.on_restart = on_restart
        self._watches: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start every worker; WorkerFailed (the others stopped) if one exits before ready."""
        results = await asyncio.gather(*(w.start() for w in self.all), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                await self.stop()
                raise result
        for worker in self.all:
            worker.url = worker.started_url
        self._watches = [asyncio.create_task(self._watch(w)) for w in self.all]

    async def _watch(self, worker: Worker) -> None:
        attempt = 0
        while not self.stopping:
            assert worker.process is not None
            status = await worker.process.wait()
            old_pid, worker.url = worker.process.pid, None
            if self.stopping:
                return
            if status == 2:
                self._fail(WorkerFailed(f"proxy worker {worker.index} refused to serve", 2))
                return
            await asyncio.sleep(_RESTART_DELAYS_S[min(attempt, len(_RESTART_DELAYS_S) - 1)])
            try:
                await worker.start()
            except WorkerFailed as exc:
                log.error("%s while restarting; trying again", exc)
                attempt += 1
                continue
            attempt = 0
            if self.on_restart is not None:
                await self.on_restart(worker)
            worker.url = worker.started_url
            log.warning(
                "proxy worker %d (pid %d) exited with status %s; restarted as pid %d at %s, "
                "its store replayed",
                worker.index, old_pid, status, worker.process.pid, worker.url,
            )  # fmt: skip

    def _fail(self, error: WorkerFailed) -> None:
        if not self.failed.done():
            self.failed.set_result(error)

    async def stop(self) -> None:
        self.stopping = True
        for task in self._watches:
            task.cancel()
        await asyncio.gather(*(w.stop() for w in self.all))


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """A worker: ``--parent PID --index K -- FLAGS`` (see the module docstring)."""
    import argparse

    from dressage.proxy.server import main as serve

    p = argparse.ArgumentParser(prog="python -m dressage.proxy.workers")
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("flags", nargs=argparse.REMAINDER)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    _die_with_parent(args.parent)
    return serve(flags, worker_index=args.index)


if __name__ == "__main__":
    sys.exit(main())
