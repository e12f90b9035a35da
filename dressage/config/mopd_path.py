"""Where the MOPD config is: a flag or slime's ``args.mopd_config`` over
``DRESSAGE_MOPD_CONFIG``, layered as every setting is (:mod:`dressage.config.layered`).

    path = mopd_config_path(args.mopd_config, given_as="--mopd-config")  # None: neither set

The one definition of "the MOPD config path" that the driver's ``--mopd-config``, the rollout's
datasets, the reward modules and :func:`dressage.config.mopd.load_mopd_config` read: a value given
(not None, not "") wins over the variable; an empty variable is unset. The variable is declared
in :mod:`dressage.config.env`; the launcher forwards it to every Ray worker. Its old spelling,
``DRESSAGE_MOPD_TEACHER_CONFIG``, is still read, with a warning naming the new one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

from dressage.config.layered import LayeredSettings

__all__ = [
    "MOPD_CONFIG_ENV",
    "MOPD_CONFIG_OLD_ENV",
    "MopdConfigPath",
    "mopd_config_env",
    "mopd_config_path",
]

MOPD_CONFIG_ENV = "DRESSAGE_MOPD_CONFIG"
MOPD_CONFIG_OLD_ENV = "DRESSAGE_MOPD_TEACHER_CONFIG"
"""The variable's spelling before it was named like its flag (still read, with a warning)."""


class MopdConfigPath(LayeredSettings):
    """The MOPD config's path (see the module docstring)."""

    ENV: ClassVar[Mapping[str, str]] = {"path": MOPD_CONFIG_ENV}
    RENAMED: ClassVar[Mapping[str, str]] = {"path": MOPD_CONFIG_OLD_ENV}
    WHAT: ClassVar[str] = "MOPD config path"

    path: str | None = None


def mopd_config_path(
    given: str | os.PathLike[str] | None, *, given_as: str = "--mopd-config"
) -> str | None:
    """``given`` over ``$DRESSAGE_MOPD_CONFIG``; None when neither is set."""
    value = None if given is None else os.fspath(given)
    return MopdConfigPath.layered({"path": value}, given_as={"path": given_as}).path


def mopd_config_env(path: str | os.PathLike[str]) -> dict[str, str]:
    """The variables that tell a child process (a Ray worker, slime's driver) its MOPD config.

    Both spellings, set alike: the child may run an older dressage than the parent (the cluster
    image's, or another ``--python``'s), which reads only ``DRESSAGE_MOPD_TEACHER_CONFIG``; this
    version reads the new one and, the two agreeing, warns about neither."""
    value = os.fspath(path)
    return {MOPD_CONFIG_ENV: value, MOPD_CONFIG_OLD_ENV: value}
