"""★ slime's ``train_async.py`` loop with every weight update wrapped in a proxy pause.

    python -m dressage.training.train_async_with_rollout_pause \\
      --rollout-function-path \\
        dressage.rollout.partial_async_rollout.generate_rollout_partial_async \\
      --custom-generate-function-path dressage.rollout.generate.blackbox_dispatch.generate \\
      --dressage-proxy-url http://PROXY:8000 <Megatron model flags> <slime flags>

The loop (:func:`train_async`) is slime's one-step off-policy pipeline (reference/slime.md §6.2)
written once over a small :class:`AsyncTrainBackend`: rollout ``N + 1`` is generated while
``N`` trains; every ``--update-weights-interval`` rollouts the driver waits for the rollout in
flight, then updates the weights. Both ``update_weights`` calls (the initial push and the one
in the loop) go through :func:`~dressage.training.rollout_pause.update_weights_with_pause`, so
agents still running in the background (the partial-async rollout's worker) are stopped at a
token boundary by the proxy and continue with the new weights after the update, as
``DRESSAGE_PROXY_PAUSE_AROUND_WEIGHT_UPDATE``, ``DRESSAGE_PROXY_PAUSE_REQUIRED`` and
``DRESSAGE_PROXY_PAUSE_TIMEOUT_SEC`` say.

Two backends run the same loop: :class:`SlimeBackend` (below: Ray actors from slime's
``create_*`` functions, slime imported lazily) and the embedded one
(``dressage.training.embedded.async_backend``: the PyTorch trainer, the embedded engine and a
rollout thread), which ``python -m dressage.jobs.train`` uses on one machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

from dressage.training.rollout_pause import RolloutPause, update_weights_with_pause

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

    def generate(self, rollout_id: int) -> Any:
        """Start generating rollout ``rollout_id``; returns a handle (slime: an ObjectRef)."""
        ...

    def wait(self, handle: Any) -> Any:
        """The rollout data of a handle (slime: ``ray.get``)."""
        ...

    def train(self, rollout_id: int, rollout_data: Any) -> None: ...

    def save(self, rollout_id: int) -> None: ...

    def update_weights(self) -> int | None:
        """Push the trainer's weights to the engines; the new weight version if known."""
        ...

    def evaluate(self, rollout_id: int) -> None: ...

    def dispose(self) -> None: ...


def _periodic(rollout_id: int, interval: int | None, num_rollout: int | None = None) -> bool:
    if not interval:
        return False
    last = num_rollout is not None and rollout_id + 1 == num_rollout
    return (rollout_id + 1) % interval == 0 or last


def train_async(args: Any, backend: AsyncTrainBackend, pause: RolloutPause) -> None:
    """slime ``train_async.py``'s loop over ``backend`` (see the module docstring)."""
    start = int(getattr(args, "start_rollout_id", 0) or 0)
    num_rollout = int(args.num_rollout)
    interval = int(getattr(args, "update_weights_interval", 1) or 1)

    update_weights_with_pause(pause, backend.update_weights, reason="initial weights")

    next_rollout = backend.generate(start) if start < num_rollout else None
    rollout_data: Any = None
    for rollout_id in range(start, num_rollout):
        if next_rollout is not None:
            rollout_data = backend.wait(next_rollout)
        # Start the next rollout before training on this one: they overlap.
        next_rollout = backend.generate(rollout_id + 1) if rollout_id + 1 < num_rollout else None

        backend.train(rollout_id, rollout_data)

        if _periodic(rollout_id, getattr(args, "save_interval", None), num_rollout):
            backend.save(rollout_id)

        if (rollout_id + 1) % interval == 0:
            # Never update while the visible rollout call runs: take its result first (the
            # background agents keep going; the proxy pause catches them).
            rollout_data = backend.wait(next_rollout) if next_rollout is not None else None
            next_rollout = None
            update_weights_with_pause(pause, backend.update_weights, reason=f"rollout {rollout_id}")

        if _periodic(rollout_id, getattr(args, "eval_interval", None)):
            backend.evaluate(rollout_id)
    backend.dispose()


class SlimeBackend:
    """The cluster port: slime's Ray actors, built as ``train_async.py`` builds them."""

    def __init__(self, args: Any) -> None:
        import ray
        from slime.observability.logging_utils import init_tracking
        from slime.ray.placement_group import (
            create_placement_groups,
            create_rollout_manager,
            create_training_models,
        )

        if getattr(args, "colocate", False):
            raise ValueError("async training cannot run with --colocate (as slime's train_async)")
        self.args = args
        self._ray = ray
        self._checked = False
        pgs = create_placement_groups(args)
        init_tracking(args)
        self.rollout_manager, _ = create_rollout_manager(args, pgs["rollout"])
        self.actor_model, self.critic_model = create_training_models(
            args, pgs, self.rollout_manager
        )

    def generate(self, rollout_id: int) -> Any:
        return self.rollout_manager.generate.remote(rollout_id)

    def wait(self, handle: Any) -> Any:
        return self._ray.get(handle)

    def train(self, rollout_id: int, rollout_data: Any) -> None:
        actor_model, critic_model = self.actor_model, self.critic_model
        if critic_model is None:
            self._ray.get(actor_model.async_train(rollout_id, rollout_data))
            return
        critic = critic_model.async_train(rollout_id, rollout_data)
        if rollout_id >= int(getattr(self.args, "num_critic_only_steps", 0) or 0):
            self._ray.get(actor_model.async_train(rollout_id, rollout_data))
        self._ray.get(critic)

    def save(self, rollout_id: int) -> None:
        self.actor_model.save_model(rollout_id)
        if self.critic_model is not None:
            self.critic_model.save_model(rollout_id)
        self._ray.get(self.rollout_manager.save.remote(rollout_id))

    def update_weights(self) -> int | None:
        self.actor_model.update_weights()
        if getattr(self.args, "check_weight_update_equal", False) and not self._checked:
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from slime.utils.arguments import parse_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if argv is not None:  # Megatron's parser reads sys.argv itself
        sys.argv = [sys.argv[0], *argv]
    args = parse_args(add_custom_arguments=add_rollout_pause_arguments)
    pause = RolloutPause.from_env(proxy_url=args.dressage_proxy_url, mode=args.dressage_pause_mode)
    started = time.monotonic()
    train_async(args, SlimeBackend(args), pause)
    elapsed = time.monotonic() - started
    log.info("async training done in %.0f s, %d weight updates", elapsed, len(pause.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
