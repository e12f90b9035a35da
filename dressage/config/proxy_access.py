"""Which proxy the rollout reads and with what key: slime's ``args.dressage_proxy_url`` and
``args.dressage_proxy_admin_key`` over ``DRESSAGE_PROXY_URL`` and ``DRESSAGE_PROXY_ADMIN_KEY``.

    access = ProxyAccessSettings.from_args(args)   # access.proxy_url None: no proxy
    url = ProxyAccessSettings.layered({"proxy_url": flag}, given_as=...).proxy_url

Layered as every setting is (:mod:`dressage.config.layered`): an attribute or flag that is set
(not None, not "") wins over its variable; an empty variable is unset. Both variables are the
proxy's own (:mod:`dressage.config.proxy`, ``dressage env``); the black-box dispatch's and the
pause client's settings read them the same way (:mod:`~dressage.config.agent_dispatch`,
:mod:`~dressage.config.pause_client`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from dressage.config.layered import LayeredSettings
from dressage.config.proxy import PROXY_ENV
from dressage.slime.rollout_args import rollout_args

__all__ = ["ProxyAccessSettings"]


class ProxyAccessSettings(LayeredSettings):
    """The proxy's URL and admin key (see the module docstring)."""

    ENV: ClassVar[Mapping[str, str]] = {
        "proxy_url": "DRESSAGE_PROXY_URL",
        "admin_key": PROXY_ENV["admin_key"],
    }
    SECRETS: ClassVar[frozenset[str]] = frozenset({"admin_key"})
    WHAT: ClassVar[str] = "proxy access settings"

    proxy_url: str | None = None
    admin_key: str | None = None

    @classmethod
    def from_args(cls, args: Any) -> Self:
        """slime's ``args`` over the variables (None where neither is set)."""
        view = rollout_args(args)
        given = {"proxy_url": view.dressage_proxy_url, "admin_key": view.dressage_proxy_admin_key}
        return cls.layered(given, given_as=_AS_ARGS)


_AS_ARGS: Mapping[str, str] = {
    "proxy_url": "args.dressage_proxy_url",
    "admin_key": "args.dressage_proxy_admin_key",
}
