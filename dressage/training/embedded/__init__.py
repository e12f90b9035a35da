"""The embedded trainer: a single-process PyTorch adapter of slime's trainer port.

See :mod:`dressage.training.embedded.trainer` for the run command and the semantics.
"""

from dressage.training.embedded.args import SLIME_TRAIN_DEFAULTS, trainer_args
from dressage.training.embedded.schedule import Schedule, TrainStep, build_schedule
from dressage.training.embedded.trainer import EmbeddedTrainer, resolve_device

__all__ = [
    "SLIME_TRAIN_DEFAULTS",
    "EmbeddedTrainer",
    "Schedule",
    "TrainStep",
    "build_schedule",
    "resolve_device",
    "trainer_args",
]
