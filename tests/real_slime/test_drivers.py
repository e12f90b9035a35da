"""The project's drivers make slime's own driver calls: same calls, same order, same arguments.

slime's real ``train.py`` and ``train_async.py`` (loaded from ``$SLIME_ROOT``) and the project's
``dressage.training.mopd_train.train`` and ``train_async_with_rollout_pause.train_async`` over
``SlimeBackend`` run, case by case, against one set of recording fakes for what only a cluster
has: the placement groups, the rollout manager (its ``.remote`` methods), the actor and critic
groups (``RayTrainGroup``'s methods), tracking, the logger and ``ray.get``. Every call is written
into one ordered trace, with its arguments bound to the real slime signature (so a keyword and a
positional argument compare equal, and a call slime's signature would refuse fails the test).
Each project trace must equal slime's trace for the same options, except for the differences
listed in ``DIFFERENCES`` (each with its reason); ``test_every_listed_difference_occurs`` keeps
that table honest. The async driver's proxy pause is a recording stand-in, so the comparison
also checks that every weight update is paused and resumed.

Also here: the drivers' local copy of ``should_run_periodic_action`` (used only when slime is
not importable) behaves exactly as slime's, and the embedded backend refuses ``--release-train``
before anything runs.

    SLIME_ROOT=/path/to/slime .venv/bin/python -m pytest tests/real_slime/test_drivers.py -q
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from dressage.training.proxy_pause_client import RolloutPause

pytestmark = pytest.mark.unit

ARGS = "<args>"
"""How the run's own namespace appears in the trace (any other namespace is shown as itself)."""

SLIME_OF = {"mopd_train": "train.py", "train_async_with_rollout_pause": "train_async.py"}


class MopdActorStandIn:
    """What ``make_mopd_actor_cls()`` returns here: the class mopd_train must hand to slime."""


# -- the recording fakes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """An ObjectRef stand-in, named by the call that made it."""

    call: str

    def __repr__(self) -> str:
        return f"<ref {self.call}>"


@dataclass(frozen=True)
class Got:
    """What the fake ``ray.get`` returned for a ref."""

    ref: Ref

    def __repr__(self) -> str:
        return f"<data of {self.ref.call}>"


@dataclass(frozen=True)
class Case:
    name: str
    options: dict[str, Any]
    rollouts_per_epoch: int = 3
    """What the rollout manager reports when ``num_rollout`` is None (slime: from the data)."""
    checkpoint_rollout_id: int = 0
    """The start id the actors load when ``start_rollout_id`` is None (slime: the checkpoint)."""


# Every option either loop reads, at slime's defaults (slime/utils/arguments.py).
BASE: dict[str, Any] = {
    "num_rollout": 4,
    "num_epoch": None,
    "start_rollout_id": 0,
    "save_interval": None,
    "eval_interval": None,
    "skip_eval_before_train": False,
    "offload_rollout": False,
    "offload_train": False,
    "use_critic": False,
    "num_critic_only_steps": 0,
    "release_train": False,
    "rollout_global_dataset": True,
    "update_weights_interval": 1,
    "check_weight_update_equal": False,
    "colocate": False,
    "use_wandb": False,
}

CASES = [
    Case("plain", {}),
    Case("intervals", {"num_rollout": 5, "save_interval": 2, "eval_interval": 2}),
    # 2 epochs of 3: the boundary (rollout 2) is a multiple of neither interval.
    Case(
        "epochs",
        {"num_rollout": None, "num_epoch": 2, "save_interval": 2, "eval_interval": 4},
        rollouts_per_epoch=3,
    ),
    Case("no_global_dataset", {"rollout_global_dataset": False, "save_interval": 2}),
    Case(
        "critic",
        {"use_critic": True, "num_critic_only_steps": 2, "save_interval": 1, "eval_interval": 3},
    ),
    Case("release_train", {"release_train": True, "offload_rollout": True, "save_interval": 3}),
    Case("offload", {"offload_rollout": True, "offload_train": True, "eval_interval": 2}),
    Case("offload_rollout_only", {"offload_rollout": True, "save_interval": 2}),
    Case("weights_every_2", {"update_weights_interval": 2, "save_interval": 2}),
    Case("weights_every_3", {"num_rollout": 5, "update_weights_interval": 3, "eval_interval": 2}),
    Case(
        "resumed", {"start_rollout_id": 2, "num_rollout": 5, "save_interval": 2, "eval_interval": 2}
    ),
    Case(
        "resumed_from_checkpoint",
        {"start_rollout_id": None, "eval_interval": 1},
        checkpoint_rollout_id=1,
    ),
    Case("skip_eval_before_train", {"eval_interval": 2, "skip_eval_before_train": True}),
    Case("check_weights", {"check_weight_update_equal": True}),
    Case("eval_only", {"num_rollout": 0, "eval_interval": 1}),
    Case("colocate", {"colocate": True}),
]


def _bound(real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``k=v, ...`` of a call bound to the real signature, defaults applied."""
    signature = inspect.signature(real)
    if next(iter(signature.parameters), None) == "self":
        args = (None, *args)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return ", ".join(
        f"{k}={v!r}" for k, v in bound.arguments.items() if k != "self" and not k.startswith("_")
    )


class Cluster:
    """The fakes of one run; every call goes into ``trace`` (a line per call)."""

    def __init__(
        self, case: Case, args: types.SimpleNamespace, real: dict[str, Callable[..., Any]]
    ) -> None:
        from slime.ray.actor_group import RayTrainGroup
        from slime.ray.rollout import RolloutManager

        self.case, self.args = case, args
        self._real = real
        """The functions the fakes stand for (their signatures bind the recorded calls)."""
        self.trace: list[str] = []
        self.rollout_manager = _FakeRemoteActor(self, "rollout_manager", RolloutManager)
        self.actor = _FakeGroup(self, "actor", RayTrainGroup)
        self.critic = _FakeGroup(self, "critic", RayTrainGroup)
        self.pgs = {"actor": "pg:actor", "critic": "pg:critic", "rollout": "pg:rollout"}

    def record(self, name: str, real: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
        shown = tuple(ARGS if a is self.args else a for a in args)
        line = f"{name}({_bound(real, shown, kwargs)})"
        self.trace.append(line)
        return line

    # slime.ray.placement_group
    def create_placement_groups(self, args: Any) -> dict[str, str]:
        self.record("create_placement_groups", self._real["create_placement_groups"], args)
        return self.pgs

    def create_rollout_manager(self, args: Any, pg: Any) -> tuple[Any, int | None]:
        self.record("create_rollout_manager", self._real["create_rollout_manager"], args, pg)
        per_epoch = None
        if args.num_rollout is None:  # as slime: the rollout count follows from the data
            per_epoch = self.case.rollouts_per_epoch
            args.num_rollout = per_epoch * args.num_epoch
        return self.rollout_manager, per_epoch

    def create_training_models(
        self, args: Any, pgs: Any, rollout_manager: Any, actor_cls: Any = None
    ) -> tuple[Any, Any]:
        real = self._real["create_training_models"]
        self.record("create_training_models", real, args, pgs, rollout_manager, actor_cls=actor_cls)
        assert pgs is self.pgs and rollout_manager is self.rollout_manager
        critic = self.critic if args.use_critic and args.num_rollout != 0 else None
        if args.start_rollout_id is None:  # as slime: the loaded checkpoint's rollout id
            args.start_rollout_id = self.case.checkpoint_rollout_id
        return self.actor, critic

    # slime.observability.logging_utils
    def configure_logger(self, *args: Any, **kwargs: Any) -> None:
        self.record("configure_logger", self._real["configure_logger"], *args, **kwargs)

    def init_tracking(self, *args: Any, **kwargs: Any) -> None:
        self.record("init_tracking", self._real["init_tracking"], *args, **kwargs)

    def finish_tracking(self, *args: Any, **kwargs: Any) -> None:
        self.record("finish_tracking", self._real["finish_tracking"], *args, **kwargs)

    # ray
    def ray_get(self, object_refs: Any, **kwargs: Any) -> Any:
        assert isinstance(object_refs, Ref), f"ray.get({object_refs!r}): not a ref of the fakes"
        self.record("ray.get", self._real["get"], object_refs, **kwargs)
        return Got(object_refs)


PLACEMENT_NAMES = ("create_placement_groups", "create_rollout_manager", "create_training_models")
LOGGING_NAMES = ("configure_logger", "init_tracking", "finish_tracking")


class _FakeGroup:
    """An actor or critic group: any public ``RayTrainGroup`` method, recorded."""

    def __init__(self, cluster: Cluster, role: str, real_cls: type) -> None:
        self._cluster, self._role, self._real_cls = cluster, role, real_cls

    def __repr__(self) -> str:
        return f"<{self._role} group>"

    def __getattr__(self, name: str) -> Any:
        real = vars(self._real_cls).get(name)
        if name.startswith("_") or not callable(real):
            raise AttributeError(f"RayTrainGroup has no method {name!r}")

        def call(*args: Any, **kwargs: Any) -> Any:
            line = self._cluster.record(f"{self._role}.{name}", real, *args, **kwargs)
            return Ref(line) if name == "async_train" else None

        return call


class _FakeRemoteActor:
    """The rollout manager: ``manager.<method>.remote(...)`` for its real methods, recorded."""

    def __init__(self, cluster: Cluster, name: str, ray_actor_cls: Any) -> None:
        self._cluster, self._name = cluster, name
        self._real_cls = ray_actor_cls.__ray_actor_class__

    def __repr__(self) -> str:
        return f"<{self._name}>"

    def __getattr__(self, method: str) -> Any:
        real = vars(self._real_cls).get(method)
        if method.startswith("_") or not callable(real):
            raise AttributeError(f"RolloutManager has no method {method!r}")
        return _RemoteMethod(self._cluster, f"{self._name}.{method}", real)


@dataclass(frozen=True)
class _RemoteMethod:
    cluster: Cluster
    name: str
    real: Callable[..., Any]

    def remote(self, *args: Any, **kwargs: Any) -> Ref:
        return Ref(self.cluster.record(self.name, self.real, *args, **kwargs))


# -- running a driver ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    trace: list[str] = field(default_factory=list)
    error: str | None = None


def _load_script(root: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"slime_script_{name}", root / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scripts(slime_checkout: Path) -> dict[str, types.ModuleType]:
    """slime's own ``train.py`` and ``train_async.py``, loaded from the checkout."""
    return {f"{n}.py": _load_script(slime_checkout, n) for n in ("train", "train_async")}


class _RecordingPause(RolloutPause):
    """A proxy pause that writes its pause and resume into the cluster's trace."""

    def __init__(self, trace: list[str]) -> None:
        super().__init__(proxy_url="http://unused")
        self.trace = trace

    def pause(self, reason: str) -> dict[str, Any] | None:
        self.trace.append(f"proxy.pause({reason!r})")
        return {"paused": True}

    def resume(self, version: int | None, reason: str) -> dict[str, Any] | None:
        self.trace.append(f"proxy.resume({version!r})")
        return {"resumed": True}


def _script_runner(module: types.ModuleType) -> Callable[[Any, Cluster], None]:
    def run(args: Any, cluster: Cluster) -> None:
        module.train(args)

    return run


def _run_mopd(args: Any, cluster: Cluster) -> None:
    from dressage.training import mopd_train

    mopd_train.train(args)


def _run_async(args: Any, cluster: Cluster) -> None:
    from dressage.training.train_async_with_rollout_pause import SlimeBackend, train_async

    pause = _RecordingPause(cluster.trace)
    train_async(args, SlimeBackend(args), pause)


@pytest.fixture
def run(
    scripts: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[[str, Case], Outcome]:
    """``run(driver, case)``: the driver's trace (and error) against fresh fakes."""
    import ray
    import slime.observability.logging_utils as logging_utils
    import slime.ray.placement_group as placement_group

    from dressage.training import mopd_actor

    runners: dict[str, Callable[[Any, Cluster], None]] = {
        "mopd_train": _run_mopd,
        "train_async_with_rollout_pause": _run_async,
        **{name: _script_runner(module) for name, module in scripts.items()},
    }
    runs = itertools.count()
    modules = ((placement_group, PLACEMENT_NAMES), (logging_utils, LOGGING_NAMES), (ray, ("get",)))
    real = {name: getattr(module, name) for module, names in modules for name in names}

    def run_one(driver: str, case: Case) -> Outcome:
        options = BASE | case.options
        options["mopd_metrics_dir"] = str(tmp_path / f"{next(runs)}-{driver}")
        args = types.SimpleNamespace(**options)
        cluster = Cluster(case, args, real)
        for module, names in modules:
            for name in names:
                fake = getattr(cluster, "ray_get" if name == "get" else name)
                monkeypatch.setattr(module, name, fake)
                for script in scripts.values():  # the names train.py bound at its import
                    if hasattr(script, name):
                        monkeypatch.setattr(script, name, fake)
        monkeypatch.setattr(mopd_actor, "make_mopd_actor_cls", lambda: MopdActorStandIn)
        try:
            runners[driver](args, cluster)
        except Exception as exc:  # the outcome records it; the comparison judges it
            return Outcome(cluster.trace, f"{type(exc).__name__}: {exc}")
        return Outcome(cluster.trace)

    return run_one


# -- where the project differs from slime, and why -------------------------------------------


def _mopd_actor_cls(case: Case, slime: Outcome, ours: Outcome) -> tuple[Outcome, Outcome]:
    lines = [
        line.replace("actor_cls=None", f"actor_cls={MopdActorStandIn!r}")
        if line.startswith("create_training_models(")
        else line
        for line in slime.trace
    ]
    return replace(slime, trace=lines), ours


def _refused(
    slime: Outcome, ours: Outcome, *, flag: str, error: str, slime_error: str | None
) -> tuple[Outcome, Outcome]:
    """Both canonical when slime did ``slime_error`` and ours raised ``error`` naming ``flag``
    before any call; ours is left as it was otherwise, so the comparison shows it."""
    want = Outcome([], f"refused {flag}")
    got = ours
    if not ours.trace and ours.error and ours.error.startswith(f"{error}: ") and flag in ours.error:
        got = want
    slime_refused = not slime.trace and (slime.error or "").startswith(f"{slime_error}: ")
    if slime_error is not None and not slime_refused:
        return slime, got  # slime did not refuse: nothing to explain
    return want, got


def _critic_refused(case: Case, slime: Outcome, ours: Outcome) -> tuple[Outcome, Outcome]:
    if not case.options.get("use_critic"):
        return slime, ours
    return _refused(slime, ours, flag="--use-critic", error="ValueError", slime_error=None)


def _pause_around_updates(case: Case, slime: Outcome, ours: Outcome) -> tuple[Outcome, Outcome]:
    """Ours without its proxy lines, if each pause brackets exactly one weight update."""
    paused, updates, ok = False, 0, True
    for line in ours.trace:
        if line.startswith("proxy.pause("):
            ok &= not paused
            paused, updates = True, 0
        elif line.startswith("proxy.resume("):
            ok &= paused and updates == 1
            paused = False
        elif line.startswith("actor.update_weights("):
            ok &= paused
            updates += 1
    if not ok or paused:
        return slime, ours
    return slime, replace(ours, trace=[x for x in ours.trace if not x.startswith("proxy.")])


def _colocate_refused(case: Case, slime: Outcome, ours: Outcome) -> tuple[Outcome, Outcome]:
    if not case.options.get("colocate"):
        return slime, ours
    return _refused(
        slime, ours, flag="--colocate", error="ValueError", slime_error="AssertionError"
    )


def _no_second_wait(case: Case, slime: Outcome, ours: Outcome) -> tuple[Outcome, Outcome]:
    """slime's trace without a second ``ray.get`` of one rollout's ref."""
    waited: set[str] = set()
    lines = []
    for line in slime.trace:
        if line.startswith("ray.get(object_refs=<ref rollout_manager.generate("):
            if line in waited:
                continue
            waited.add(line)
        lines.append(line)
    return replace(slime, trace=lines), ours


@dataclass(frozen=True)
class Difference:
    driver: str
    what: str
    why: str
    adjust: Callable[[Case, Outcome, Outcome], tuple[Outcome, Outcome]]
    """``(case, slime's outcome, ours) -> (what slime's becomes, what ours becomes)``."""


DIFFERENCES = (
    Difference(
        "mopd_train",
        "create_training_models(..., actor_cls=MopdMegatronActor)",
        "the MOPD actor scores each sample with its teacher: the reason the driver exists",
        _mopd_actor_cls,
    ),
    Difference(
        "mopd_train",
        "--use-critic: refused with a ValueError naming it before any call; slime trains one",
        "the MOPD advantage is the clipped teacher log-ratio: there is no value function "
        "(the preflight refuses --advantage-estimator ppo as well)",
        _critic_refused,
    ),
    Difference(
        "train_async_with_rollout_pause",
        "a proxy pause before and a resume after every actor.update_weights()",
        "the proxy holds the agents' calls at a token boundary during the update; the pause "
        "is the proxy's HTTP API, not a slime call",
        _pause_around_updates,
    ),
    Difference(
        "train_async_with_rollout_pause",
        "--colocate: a ValueError naming the flag instead of slime's bare assert, no call made",
        "a named error that also survives python -O; the refusal itself is slime's",
        _colocate_refused,
    ),
    Difference(
        "train_async_with_rollout_pause",
        "no second ray.get of the last rollout before the last update",
        "on the last step slime's next-rollout future still holds the ref it already got, and "
        "gets it again before updating; that returns the same data, so the driver skips it",
        _no_second_wait,
    ),
)


def _adjusted(
    driver: str, case: Case, slime: Outcome, ours: Outcome
) -> tuple[Outcome, Outcome, list[Difference]]:
    applied = []
    for difference in DIFFERENCES:
        if difference.driver != driver:
            continue
        new_slime, new_ours = difference.adjust(case, slime, ours)
        if (new_slime, new_ours) != (slime, ours):
            applied.append(difference)
        slime, ours = new_slime, new_ours
    return slime, ours, applied


def _rollout_id(line: str) -> int:
    found = re.search(r"\brollout_id=(\d+)", line)
    assert found, line
    return int(found.group(1))


def _trained(outcome: Outcome) -> bool:
    return any(".async_train(" in line for line in outcome.trace)


# -- the tests --------------------------------------------------------------------------------


def _compare(
    run: Callable[[str, Case], Outcome], driver: str, case: Case
) -> tuple[Outcome, list[Difference]]:
    """Assert the driver's outcome is slime's but for the listed differences; returns the
    driver's outcome and the differences that applied."""
    slime = run(SLIME_OF[driver], case)
    # the fakes carry slime's own loop through: it trains whenever there is a step to run
    refuses = driver == "train_async_with_rollout_pause" and case.options.get("colocate")
    assert (slime.error is not None) == bool(refuses), slime.error
    assert _trained(slime) == (not refuses and (BASE | case.options)["num_rollout"] != 0)
    ours = run(driver, case)
    expected, got, applied = _adjusted(driver, case, slime, ours)
    assert got.trace == expected.trace
    assert got.error == expected.error
    return ours, applied


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("driver", sorted(SLIME_OF))
def test_driver_makes_slimes_calls(
    driver: str, case: Case, run: Callable[[str, Case], Outcome], tmp_path: Path
) -> None:
    ours, _ = _compare(run, driver, case)
    if driver == "mopd_train" and ours.error is None:  # its own log: a row per trained step
        (log,) = tmp_path.glob("*-mopd_train/driver.jsonl")
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        trained = [x for x in ours.trace if x.startswith("actor.async_train(")]
        assert [r["step"] for r in rows] == [_rollout_id(x) for x in trained]
        assert all(r["metrics"]["time/train_s"] >= 0 for r in rows)


def test_every_listed_difference_occurs(run: Callable[[str, Case], Outcome]) -> None:
    """Each listed difference explains a case the driver otherwise matches slime in: one that
    no case needs is stale, and the table must say what the drivers do."""
    seen: set[str] = set()
    for driver, case in itertools.product(sorted(SLIME_OF), CASES):
        seen |= {d.what for d in _compare(run, driver, case)[1]}
    assert seen == {d.what for d in DIFFERENCES}


def _outcomes(fn: Callable[..., bool], grid: Iterator[tuple[Any, ...]]) -> list[Any]:
    out: list[Any] = []
    for point in grid:
        try:
            out.append((point, fn(*point)))
        except Exception as exc:  # slime divides by the interval: 0 raises, and so must ours
            out.append((point, type(exc).__name__))
    return out


def test_the_local_periodic_action_is_slimes(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from slime.utils.misc import should_run_periodic_action

    from dressage.slime import periodic

    def grid() -> Iterator[tuple[Any, ...]]:
        return itertools.product(
            range(14), (None, 0, 1, 2, 3, 5), (None, 1, 3, 4), (None, 1, 5, 8, 13)
        )

    local = periodic.should_run_periodic_action
    assert _outcomes(local, grid()) == _outcomes(should_run_periodic_action, grid())
    assert any(result is True for _, result in _outcomes(local, grid()))
    assert periodic.periodic_action() is should_run_periodic_action
    monkeypatch.setitem(sys.modules, "slime.utils", None)  # slime not importable
    assert periodic.periodic_action() is local


def test_the_embedded_backend_refuses_release_train_before_anything_runs(tmp_path: Path) -> None:
    from dressage.training.embedded.async_backend import EmbeddedAsyncBackend
    from dressage.training.proxy_pause_client import RolloutPause
    from dressage.training.train_async_with_rollout_pause import train_async

    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"{name} was reached before the refusal")

    backend = EmbeddedAsyncBackend(
        trainer=Untouchable(),
        rollout_manager=Untouchable(),
        engine_url="http://unused",
        weights_dir=tmp_path,
        version=0,
    )
    pause = RolloutPause(proxy_url=None, enabled=False)
    args = types.SimpleNamespace(num_rollout=2, release_train=True)
    with pytest.raises(ValueError, match=re.escape("--release-train")):
        train_async(args, backend, pause)
    assert not pause.events and not backend.timeline
