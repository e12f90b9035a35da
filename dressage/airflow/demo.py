"""The main job: ``dressage_mopd`` on the embedded default, through Airflow, with live progress.

    make demo                                      # scripts/demo.sh: bootstrap, then this
    python -m dressage.airflow.demo --steps 8 --conf '{"rollout_batch_size": 4}'

Airflow (SQLite metadata in ``$AIRFLOW_HOME``, default ``<repo>/airflow_home``) runs the DAG
with ``dag.test()``: every task, the deferral of the training job and its trigger, in this one
process. While it runs this prints each task as it starts and ends and the training job's own
progress lines; at the end, the summary (teachers, steps, reverse KL and reward per teacher,
artifact URL) and where the PNG of the curves is. Airflow's own logging is kept at WARNING
(``--verbose`` shows all of it). Exit code 0 only when the DAG run succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dressage.commands import command_parser
from dressage.config.job import EMBEDDED_MOPD_OPTIONS
from dressage.config.layered import LayeredSettings, SettingsError

PROJECT = Path(__file__).resolve().parents[2]
DAG_ID = "dressage_mopd"
EMBEDDED_RECIPE: dict[str, Any] = {
    "rollout_batch_size": 32,
    "learning_rate": 2e-3,
    "extra": {**EMBEDDED_MOPD_OPTIONS, "eval_interval": 10},
}
"""Settings for the tiny embedded models (the job's defaults are a real model's): a learning rate
they move at, short agent turns, the dense objective with half its weight on the forward KL
(mopd_forward_kl_weight), a step's 32 samples trained in one or two packed micro-batches (their
shared prompt computed once) instead of 32; groups whose oldest token is more than 2 weight
versions old are dropped and their prompts generated again (the agents now outpace the trainer:
without a bound the queue of finished groups grew until the trainer saw samples 50 versions
old); held-out accuracy every tenth step (and before and after the run)."""


class DemoSettings(LayeredSettings):
    """``--steps`` over ``DEMO_STEPS`` (``make demo``'s) over 100, as every setting is layered
    (:mod:`dressage.config.layered`)."""

    ENV: ClassVar[Mapping[str, str]] = {"steps": "DEMO_STEPS"}
    WHAT: ClassVar[str] = "demo settings"

    steps: int = 100


def _environment(verbose: bool) -> None:
    """Airflow reads its settings when first imported: set them before that."""
    os.environ.setdefault("AIRFLOW_HOME", str(PROJECT / "airflow_home"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT / "dags"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not verbose:
        os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    if not os.environ.get("AIRFLOW__CORE__FERNET_KEY"):  # XComs encrypted at rest
        os.environ["AIRFLOW__CORE__FERNET_KEY"] = _fernet_key(home / ".fernet_key")


def _fernet_key(path: Path) -> str:
    """The home's Fernet key, made once (mode 0600) and reused by every later run."""
    if not path.exists():
        from cryptography.fernet import Fernet

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(Fernet.generate_key().decode())
    return path.read_text().strip()


class Progress:
    """Polls the run's task states and tails the training job's log from a side thread."""

    def __init__(self, run_root: Path) -> None:
        self.run_root = run_root
        self.started = time.monotonic()
        self.seen: dict[str, str] = {}
        self.offsets: dict[Path, int] = {}
        self.after_id = 0
        """Only DAG runs newer than this one are this demo's (earlier runs share the DB)."""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            self.poll()

    def poll(self) -> None:
        try:
            self._tasks()
        except Exception as exc:  # a busy SQLite file: try again on the next tick
            if "locked" not in str(exc):
                self.say(f"(progress: {type(exc).__name__}: {exc})")
        self._job_lines()

    def _latest_run(self, session: Any) -> Any:
        from airflow.models.dagrun import DagRun
        from sqlalchemy import select

        query = select(DagRun).where(DagRun.dag_id == DAG_ID, DagRun.id > self.after_id)
        return session.scalars(query.order_by(DagRun.id.desc()).limit(1)).first()

    def mark_start(self) -> None:
        from airflow.utils.session import create_session

        with create_session() as session:
            run = self._latest_run(session)
            self.after_id = int(run.id) if run is not None else 0

    def _tasks(self) -> None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            run = self._latest_run(session)
            if run is None:
                return
            query = select(TaskInstance).where(
                TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run.run_id
            )
            for ti in session.scalars(query):
                state = str(ti.state or "")
                if state and self.seen.get(ti.task_id) != state and state != "scheduled":
                    self.seen[ti.task_id] = state
                    self.say(f"{ti.task_id:<18} {state}")

    def _job_lines(self) -> None:
        for log in sorted(self.run_root.glob(f"{DAG_ID}/*/jobs/*-train*/job.log")):
            offset = self.offsets.get(log, 0)
            with open(log, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offsets[log] = offset + end
            for line in data[:end].decode(errors="replace").splitlines():
                self.say(f"  | {line}")


def _skip_old_logs(progress: Progress) -> None:
    """Start the job tails at the end of any earlier run's logs."""
    for log in progress.run_root.glob(f"{DAG_ID}/*/jobs/*-train*/job.log"):
        progress.offsets[log] = log.stat().st_size


def _conf(args: argparse.Namespace) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "backend": "embedded",
        "steps": args.steps,
        "seed": args.seed,
        "run_root": str(args.run_root),
        "artifact_root": args.artifact_root,
        **EMBEDDED_RECIPE,
    }
    conf.update(json.loads(args.conf))
    return conf


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m dressage.airflow.demo",
        description=__doc__,
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps (the steps Param; default: "
        f"{DemoSettings.model_fields['steps'].default}; env DEMO_STEPS)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (the seed Param)")
    parser.add_argument(
        "--run-root", type=Path, default=PROJECT / "runs" / "demo", help="the run folders"
    )
    parser.add_argument(
        "--artifact-root",
        default=(PROJECT / "runs" / "artifacts").as_uri(),
        help="where the artifacts are staged",
    )
    parser.add_argument("--conf", default="{}", help="more Params of dressage_mopd, as JSON")
    parser.add_argument("--verbose", action="store_true", help="show Airflow's own logs")
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags, ``--steps`` layered over ``DEMO_STEPS`` (a bad value: argparse's refusal)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = DemoSettings.layered({"steps": args.steps}, given_as={"steps": "--steps"})
    except SettingsError as exc:
        parser.error("; ".join(exc.sentences))
    args.steps = settings.steps
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    _environment(args.verbose)
    conf = _conf(args)
    home = Path(os.environ["AIRFLOW_HOME"])
    print(f"dressage demo: {DAG_ID} on the embedded default, AIRFLOW_HOME={home}")
    print(f"conf: {json.dumps(conf)}", flush=True)

    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    if not (home / "airflow.db").exists():
        print("initialising the Airflow metadata DB (SQLite) ...", flush=True)
        db.initdb()
    bag = DagBag(str(PROJECT / "dags"))
    if bag.import_errors:
        for path, error in bag.import_errors.items():
            print(f"import error in {path}:\n{error}", file=sys.stderr)
        return 1
    progress = Progress(Path(conf["run_root"]))
    _skip_old_logs(progress)
    progress.mark_start()
    progress.thread.start()
    try:
        run = bag.dags[DAG_ID].test(run_conf=conf)
    finally:
        progress.stop.set()
        progress.thread.join()
        progress.poll()
    return _report(run, progress)


def _report(run: Any, progress: Progress) -> int:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    state = str(run.state)
    progress.say(f"{DAG_ID} run {run.run_id}: {state}")
    if state != "success":
        failed = [t for t, s in progress.seen.items() if s == "failed"]
        print(f"\nfailed tasks: {', '.join(failed) or '?'} (their errors are above)", flush=True)
        return 1
    with create_session() as session:
        query = XComModel.get_many(
            run_id=run.run_id, key="return_value", task_ids="publish", dag_ids=DAG_ID
        )
        row = session.scalars(query).first()
        published = XComModel.deserialize_value(row) if row is not None else {}
    print("\n" + published.get("text", "(no summary)"))
    curves = published.get("summary", {}).get("curves") or ""
    if curves.startswith("file://"):
        print(f"PNG of the curves: {curves.removeprefix('file://')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
