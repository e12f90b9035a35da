"""★ slime's ``train_async.py`` loop with every weight update wrapped in a proxy pause.

    python -m dressage.training.train_async_with_rollout_pause \\
      --rollout-function-path \\
        dressage.rollout.partial_async_rollout.generate_rollout_partial_async \\
      --custom-generate-function-path dressage.rollout.generate.blackbox_dispatch.generate \\
      --dressage-proxy-url http://PROXY:8000 <Megatron model flags> <slime flags>

The loop (:func:`train_async`) is slime's one-step off-policy pipeline (docs/slime.md §6.2)
written once over a small :class:`AsyncTrainBackend`: rollout ``N + 1`` is generated while
``N`` trains; every ``--update-weights-interval`` rollouts (every rollout under
``--release-train``) the driver waits for the rollout in flight, then updates the weights. Saves
and evals fall on slime's ``should_run_periodic_action`` steps, epoch boundaries included
(:func:`dressage.slime.periodic.periodic_action`: a local copy of its semantics where slime is not
installed, for the embedded backend); the last
save and every save under ``--release-train`` are synchronous (``force_sync``). Both
``update_weights`` calls (the initial push and the one in the loop) go through
:func:`~dressage.training.proxy_pause_client.update_weights_with_pause`, so agents still running in
the background (the partial-async rollout's worker) are stopped at a token boundary by the proxy
and continue with the new weights after the update, as
``DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE``, ``DRESSAGE_PROXY_PAUSE_REQUIRED`` and
``DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC`` say.

Two backends run the same loop: :class:`SlimeBackend` (below: Ray actors from slime's
``create_*`` functions, slime imported lazily) and the embedded one
(``dressage.training.embedded.async_backend``: the PyTorch trainer, the embedded engine and a
rollout thread), which ``python -m dressage.jobs.train`` uses on one machine.

Over :class:`SlimeBackend` the driver makes slime's ``train_async.py`` calls, in its order and
with its arguments (``tests/real_slime/test_drivers.py`` runs both against the same fakes), except:

- the proxy pause and resume around every ``actor_model.update_weights()`` (the point of the
  driver; they are the proxy's HTTP API, not slime calls);
- ``--colocate`` is refused with a ValueError naming it where slime has a bare ``assert``
  (same refusal, before any call; it also holds under ``python -O``);
- slime gets the last rollout's ref a second time before the last update (its next-rollout
  future still holds the consumed ref); the driver does not wait twice for one rollout.

``--release-train`` is slime's: the actors are recreated before each step, every step saves
(synchronously) and updates the weights, whose update releases them again. A backend that
cannot release its trainer (the embedded one) refuses the flag before anything runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from dressage.config.mopd import unsupported_slime_options
from dressage.slime.args import add_dressage_arguments, loop_args
from dressage.slime.continue_from import ContinueError, apply_continue_from
from dressage.slime.periodic import periodic_action
from dressage.slime.tracking import keep_wandb_run
from dressage.slime.train_args import actor_args
from dressage.training.proxy_pause_client import RolloutPause, update_weights_with_pause

__all__ = [
    "AsyncTrainBackend",
    "SlimeBackend",
    "add_rollout_pause_arguments",
    "main",
    "train_async",
]

log = logging.getLogger(__name__)


class AsyncTrainBackend(Protocol):
    """What the loop needs from a trainer port (slime's driver calls, one each)."""

    releases_train: ClassVar[bool]
    """Whether ``update_weights`` can release the trainer and :meth:`create` bring it back
    (slime's ``--release-train``)."""

    num_rollout_per_epoch: int | None
    """Rollouts per pass over the data (slime's ``create_rollout_manager``), or None: saves and
    evals then fall on their intervals only."""

    def generate(self, rollout_id: int) -> Any:
        """Start generating rollout ``rollout_id``; returns a handle (slime: an ObjectRef)."""
        ...

    def wait(self, handle: Any) -> Any:
        """The rollout data of a handle (slime: ``ray.get``)."""
        ...

    def create(self) -> None:
        """Recreate the trainer a weight update released (``--release-train`` only)."""
        ...

    def train(self, rollout_id: int, rollout_data: Any) -> None: ...

    def save(self, rollout_id: int, *, force_sync: bool) -> None:
        """Checkpoint after ``rollout_id``; ``force_sync``: finished before returning."""
        ...

    def update_weights(self) -> int | None:
        """Push the trainer's weights to the engines; the new weight version if known."""
        ...

    def evaluate(self, rollout_id: int) -> None: ...

    def dispose(self) -> None: ...


def _refuse_release_train(args: Any, backend: AsyncTrainBackend) -> None:
    """``--release-train``, refused before anything runs on a backend that cannot release."""
    if actor_args(args).release_train and not backend.releases_train:
        raise ValueError(
            f"--release-train: {type(backend).__name__} cannot release its trainer between "
            "steps; drop the flag or train on the slime backend"
        )


def train_async(args: Any, backend: AsyncTrainBackend, pause: RolloutPause) -> None:
    """slime ``train_async.py``'s loop over ``backend`` (see the module docstring)."""
    _refuse_release_train(args, backend)
    loop = loop_args(args)
    release_train, start, num_rollout = loop.release_train, loop.start_rollout_id, loop.num_rollout
    periodic = periodic_action()
    per_epoch = backend.num_rollout_per_epoch

    update_weights_with_pause(pause, backend.update_weights, reason="initial weights")

    next_rollout = backend.generate(start)  # as slime, even when no step is left to run
    rollout_data: Any = None
    for rollout_id in range(start, num_rollout):
        if next_rollout is not None:
            rollout_data = backend.wait(next_rollout)
        # Start the next rollout before training on this one: they overlap.
        next_rollout = backend.generate(rollout_id + 1) if rollout_id + 1 < num_rollout else None

        if release_train:
            backend.create()
        backend.train(rollout_id, rollout_data)

        if release_train or periodic(rollout_id, loop.save_interval, per_epoch, num_rollout):
            backend.save(rollout_id, force_sync=release_train or rollout_id == num_rollout - 1)

        if release_train or (rollout_id + 1) % loop.update_weights_interval == 0:
            # Never update while the visible rollout call runs: take its result first (the
            # background agents keep going; the proxy pause catches them).
            rollout_data = backend.wait(next_rollout) if next_rollout is not None else None
            next_rollout = None
            update_weights_with_pause(pause, backend.update_weights, reason=f"rollout {rollout_id}")

        if periodic(rollout_id, loop.eval_interval, per_epoch, None):
            backend.evaluate(rollout_id)
    backend.dispose()


class SlimeBackend:
    """The cluster port: slime's Ray actors, built and called as ``train_async.py`` does."""

    releases_train: ClassVar[bool] = True

    def __init__(self, args: Any) -> None:
        import ray
        from slime.observability import logging_utils
        from slime.observability.logging_utils import init_tracking
        from slime.ray.placement_group import (
            create_placement_groups,
            create_rollout_manager,
            create_training_models,
        )

        if actor_args(args).colocate:
            raise ValueError("async training cannot run with --colocate (as slime's train_async)")
        logging_utils.configure_logger()
        self.args = args
        self._ray = ray
        self._checked = False
        pgs = create_placement_groups(args)
        keep_wandb_run(args)  # a resubmitted job logs to the W&B run it started
        init_tracking(args)
        self.rollout_manager, self.num_rollout_per_epoch = create_rollout_manager(
            args, pgs["rollout"]
        )
        self.actor_model, self.critic_model = create_training_models(
            args, pgs, self.rollout_manager
        )
        self.loop = loop_args(args)  # after slime's setup, which sets some of them

    def generate(self, rollout_id: int) -> Any:
        return self.rollout_manager.generate.remote(rollout_id)

    def wait(self, handle: Any) -> Any:
        return self._ray.get(handle)

    def create(self) -> None:
        self.actor_model.create()

    def train(self, rollout_id: int, rollout_data: Any) -> None:
        actor_model, critic_model = self.actor_model, self.critic_model
        if not self.loop.use_critic:
            self._ray.get(actor_model.async_train(rollout_id, rollout_data))
            return
        # the critic's values feed the actor's advantages (slime's external_data)
        value_refs = critic_model.async_train(rollout_id, rollout_data)
        if self.loop.actor_trains(rollout_id):
            self._ray.get(
                actor_model.async_train(rollout_id, rollout_data, external_data=value_refs)
            )
        else:
            self._ray.get(value_refs)

    def save(self, rollout_id: int, *, force_sync: bool) -> None:
        if self.loop.actor_trains(rollout_id):  # an actor that did not train is unchanged
            self.actor_model.save_model(rollout_id, force_sync=force_sync)
        if self.loop.use_critic:
            self.critic_model.save_model(rollout_id, force_sync=force_sync)
        if self.loop.rollout_global_dataset:  # the data source's position, to resume from
            self._ray.get(self.rollout_manager.save.remote(rollout_id))

    def update_weights(self) -> int | None:
        self.actor_model.update_weights()
        if self.loop.check_weight_update_equal and not self._checked:
            self._checked = True  # as slime: once, after the initial push
            self._ray.get(self.rollout_manager.check_weights.remote(action="compare"))
        return None  # slime numbers its versions itself: the proxy reads the engine's

    def evaluate(self, rollout_id: int) -> None:
        self._ray.get(self.rollout_manager.eval.remote(rollout_id))

    def dispose(self) -> None:
        from slime.observability.logging_utils import finish_tracking

        self._ray.get(self.rollout_manager.dispose.remote())
        finish_tracking(self.args)


def add_rollout_pause_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """slime's ``parse_args(add_custom_arguments=...)`` hook: the proxy and rollout options."""
    group = parser.add_argument_group("partial rollout (dressage)")
    add = group.add_argument
    add("--dressage-proxy-url", help="the recording proxy (default $DRESSAGE_PROXY_URL)")
    add("--dressage-pause-mode", default="abort", choices=["abort", "retract", "in_place"])
    add("--dressage-max-staleness", type=int, help="bound on a group's age in weight versions")
    add("--dressage-stale-policy", choices=["drop", "mask"], default="drop")
    add("--dressage-async-groups-in-flight", type=int, help="default: 2 x rollout batch size")
    add(
        "--dressage-async-max-groups-ahead",
        type=int,
        help="groups generating or finished and not yet trained at which the rollout waits "
        "(default: no bound)",
    )
    add_dressage_arguments(group)
    return parser


def _continued_problems(args: Any) -> list[str]:
    """What keeps the checkpoint ``--dressage-continue-from`` named from starting this student."""
    if not actor_args(args).continued:
        return []
    from dressage.training.checkpoints import continued_checkpoint_problems

    actor = actor_args(args)
    found = continued_checkpoint_problems(actor.hf_checkpoint, actor.load, actor.ckpt_step)
    return [str(problem) for problem in found]


def main(argv: Sequence[str] | None = None) -> int:
    from slime.utils.arguments import parse_args

    # no logging setup here: SlimeBackend calls slime's configure_logger, as train_async.py does
    if argv is not None:  # Megatron's parser reads sys.argv itself
        sys.argv = [sys.argv[0], *argv]
    args = parse_args(add_custom_arguments=add_rollout_pause_arguments)
    try:
        apply_continue_from(args)
    except ContinueError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    problems = [*unsupported_slime_options(args), *_continued_problems(args)]
    if problems:  # before any Ray actor exists
        print("\n".join(f"refused: {p}" for p in problems), file=sys.stderr)
        return 2
    pause = RolloutPause.from_env(proxy_url=args.dressage_proxy_url, mode=args.dressage_pause_mode)
    started = time.monotonic()
    train_async(args, SlimeBackend(args), pause)
    elapsed = time.monotonic() - started
    log.info("async training done in %.0f s, %d weight updates", elapsed, len(pause.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
