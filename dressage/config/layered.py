"""Flags over ``DRESSAGE_*`` variables over defaults, layered by pydantic-settings.

A settings class names each field's variable in ``ENV`` (field -> variable: the names are the
project's, not a prefix plus the field) and is built by :meth:`LayeredSettings.layered` from the
values a caller was given (flags, slime ``args`` attributes; None or "" = not given)::

    class PauseClientSettings(LayeredSettings):
        ENV = {"required": "DRESSAGE_PROXY_PAUSE_REQUIRED"}
        required: bool = False

    PauseClientSettings.layered({"required": None}, given_as={"required": "--required"})

A given value wins over its variable, a variable over the field's default (written once, on the
field); an empty variable is unset, but for a key (``SECRETS``), where it is an error, as an
empty key given is. A field
missing from ``ENV`` is set by a given value only
(a settings class layered over a model whose every field is a flag, not every one a variable).
A value that does not validate is a :class:`SettingsError` naming where it came from (the flag or
the variable) and the value (never a key's); its ``sentences`` say the same one problem a line,
for a command line to print.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, Self

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from dressage.commands import error_message
from dressage.config.env import declare, env_secret

__all__ = [
    "LayeredSettings",
    "NamedVariables",
    "SettingsError",
    "declare_variables",
    "env_default",
]

_log = logging.getLogger(__name__)


class SettingsError(ValueError):
    """Settings that cannot run; the message names the flag or variable and the value."""

    def __init__(self, message: str, sentences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.sentences = sentences or (message,)
        """One sentence a problem, each naming its flag or variable: ``--seed should be a
        valid integer, ..., got 'x'``."""


class _Hidden:
    """A key's value in an error: never echoed."""

    def __repr__(self) -> str:
        return "<hidden>"


class NamedVariables(EnvSettingsSource):
    """Each field from the variable ``names`` gives it (not prefix + field name); an empty
    variable is unset. The environment source of every layered settings class."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        names: Mapping[str, str],
        renamed: Mapping[str, str] | None = None,
        given: Collection[str] = (),
    ) -> None:
        super().__init__(settings_cls, case_sensitive=True, env_ignore_empty=True)
        self.names = names
        self.renamed = renamed or {}
        """Field -> the variable it was read from before its rename: still read when the new
        one is unset, with a deprecation warning naming the new one; set to another value
        beside the new one, it is ignored with a warning saying that the new one wins."""
        self.given = frozenset(given)
        """Fields given a value (a flag): their old variables are not read, nor warned about."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        name = self.names.get(field_name)
        if name is None:  # a field no variable sets
            return None, field_name, self.field_is_complex(field)
        value = self.env_vars.get(name)
        old = None if field_name in self.given else self.renamed.get(field_name)
        old_value = None if old is None else self.env_vars.get(old)
        if old is not None and old_value not in (None, ""):
            if value in (None, ""):
                _log.warning("%s is deprecated; set %s instead", old, name)
                return old_value, old, self.field_is_complex(field)
            if old_value != value:  # both set alike (for an older child) is no mistake
                _log.warning("%s is deprecated and ignored: %s is set too and wins", old, name)
        return value, name, self.field_is_complex(field)


class LayeredSettings(BaseSettings):
    """Base of a layered settings class (see the module docstring)."""

    model_config = SettingsConfigDict(
        extra="forbid", frozen=True, case_sensitive=True, env_ignore_empty=True
    )

    ENV: ClassVar[Mapping[str, str]] = {}
    """Field -> its variable: a ``DRESSAGE_*`` one, or a name users' scripts already export
    (the launcher's ``TP_SIZE``, Ray's ``RAY_ADDRESS``); a field without one is set by a given
    value only."""
    SECRETS: ClassVar[frozenset[str]] = frozenset()
    """Keys: their values are never echoed in an error, and a key's variable set but empty is
    an error (what an unset ``$KEY`` expands to in a shell), not "no key"."""
    RENAMED: ClassVar[Mapping[str, str]] = {}
    """Field -> the variable it was read from before its rename (read when the new one is
    unset, with a warning naming the new one; when both are set and differ, the new one wins,
    and the warning says so)."""
    WHAT: ClassVar[str] = "settings"
    """What the settings are, for error messages."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = init_settings.init_kwargs if isinstance(init_settings, InitSettingsSource) else {}
        return init_settings, NamedVariables(cls, cls.ENV, cls.RENAMED, given)

    @classmethod
    def layered(cls, given: Mapping[str, Any], *, given_as: Mapping[str, str]) -> Self:
        """``given`` (None or "" = not given) over the variables over the defaults, validated;
        ``given_as`` names where each given field came from (a flag, an ``args`` attribute)."""
        values = {field: value for field, value in given.items() if value not in (None, "")}
        for field in sorted(cls.SECRETS & given.keys()):  # `--key "$KEY"` with $KEY unset
            value = given[field]
            if isinstance(value, str) and not value.strip():
                flag = given_as.get(field, field)
                sentence = (
                    f"{flag} is empty: an empty key is not 'no key'; give a key or leave it out"
                )
                raise SettingsError(f"invalid {cls.WHAT}: {sentence}", (sentence,))
        for field in sorted(cls.SECRETS - values.keys()):
            name = cls.ENV.get(field)
            try:
                env_secret(name) if name else None  # set but empty: an error, never "no key"
            except ValueError as exc:
                raise SettingsError(f"invalid {cls.WHAT}: {exc}", (str(exc),)) from None
        try:
            return cls(**values)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            problems = [cls._problem(error, values, given_as) for error in errors]
            sentences = tuple(cls._sentence(error, values, given_as) for error in errors)
            raise SettingsError(f"invalid {cls.WHAT}: " + "; ".join(problems), sentences) from None

    @classmethod
    def _source(
        cls, error: Mapping[str, Any], values: Mapping[str, Any], given_as: Mapping[str, str]
    ) -> tuple[str, str]:
        """The error's field, and where its value came from: the given value's name, else the
        variable (a missing field: both)."""
        field = ".".join(map(str, error["loc"])) or "settings"
        flag = given_as.get(field, field)
        if field in values:
            return field, flag
        if error["type"] == "missing" and field in cls.ENV:
            return field, f"{flag} or {cls.ENV[field]}"
        return field, cls.ENV.get(field, flag)

    @classmethod
    def _problem(
        cls, error: Mapping[str, Any], values: Mapping[str, Any], given_as: Mapping[str, str]
    ) -> str:
        if not error["loc"]:
            return _across_fields(error)
        field, source = cls._source(error, values, given_as)
        if error["type"] == "missing":  # its input is everything else given: never shown
            return f"{source}: {error['msg']}"
        value = "<hidden>" if field in cls.SECRETS else repr(error.get("input"))
        return f"{source}={value}: {error['msg']}"

    @classmethod
    def _sentence(
        cls, error: Mapping[str, Any], values: Mapping[str, Any], given_as: Mapping[str, str]
    ) -> str:
        if not error["loc"]:
            return _across_fields(error)
        field, source = cls._source(error, values, given_as)
        shown = {**error, "input": _Hidden()} if field in cls.SECRETS else error
        return f"{source} {error_message(shown, cls)}"


def _across_fields(error: Mapping[str, Any]) -> str:
    """A check across fields (a model validator) says its own sentence, naming its fields; its
    input (every value, keys too) is never shown."""
    return str(error["msg"]).removeprefix("Value error, ")


def env_default(info: FieldInfo) -> str | None:
    """A field's default as ``dressage env`` shows it (the way one would export it)."""
    value = info.default
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def declare_variables(cls: type[LayeredSettings], fields: tuple[str, ...]) -> None:
    """Declare the variables of ``fields`` (those ``cls`` owns) with their fields' defaults."""
    for field in fields:
        info = cls.model_fields[field]
        declare(cls.ENV[field], env_default(info), info.description or "")
