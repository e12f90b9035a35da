"""What every ``dressage`` command line shares: its name, ``--version``, defaults in its help,
and validation errors as one sentence each.

    parser = command_parser("python -m dressage.launch.slime_command", description="...")
    with invoked_as("dressage mopd launch"):      # what dressage.cli does before a subcommand
        main(argv)                                # its usage line says "dressage mopd launch"
    sentences = validation_sentences(exc, flag=lambda field: "--" + field.replace("_", "-"))

A module's parser names itself by how it was started: ``dressage mopd launch`` through the
``dressage`` command, ``python -m ...`` otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.metadata
import logging
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

__all__ = [
    "DefaultsHelpFormatter",
    "RenamedFlag",
    "command_parser",
    "did_you_mean",
    "error_message",
    "field_help",
    "invoked_as",
    "plain",
    "validation_sentences",
    "version",
]

_INVOKED_AS: list[str] = []


def version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    try:
        return importlib.metadata.version("dressage")
    except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        return "unknown"


@contextlib.contextmanager
def invoked_as(name: str) -> Iterator[None]:
    """Parsers built inside name themselves ``name`` (``dressage mopd launch``)."""
    _INVOKED_AS.append(name)
    try:
        yield
    finally:
        _INVOKED_AS.pop()


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text.lower()
            or default is None
            or default is False  # a store_true flag (0 and 0.0 are shown)
            or default is argparse.SUPPRESS
            or default == []
            or not action.option_strings
        ):
            return plain(text)
        return f"{plain(text)} (default: %(default)s)"


_UNSET: Any = object()


_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def plain(text: str) -> str:
    """Help text without Sphinx markup (````x````, ``:func:`y```, ``:mod:`~a.b```), which
    argparse would show as it is; whitespace folded."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return " ".join(text.replace("``", "").split())


def field_help(
    info: FieldInfo, *, env: str | None = None, default: Any = _UNSET, secret: bool = False
) -> str:
    """A flag's help from the field it sets: its description, then its real default and its
    variable, ``(default: 8000; env DRESSAGE_PROXY_PORT)``. Flags that fall to a variable when
    unset have None as their argparse default, which would show nothing; a key (``secret``)
    shows its variable only. ``default`` replaces the field's (one computed elsewhere)."""
    text = plain(info.description or "").removesuffix(".").replace("%", "%%")
    value = info.default if default is _UNSET else default
    parts = []
    if not secret and value is not None and not info.is_required():
        parts.append(f"default: {value}".replace("%", "%%"))
    if env:
        parts.append(f"env {env}")
    return f"{text} ({'; '.join(parts)})" if parts else text


def command_parser(prog: str, **kwargs: Any) -> argparse.ArgumentParser:
    """An argparse parser named as it was invoked, with ``--version`` and defaults in its help.

    ``prog`` is the name used when no ``dressage`` command started it (``python -m ...``).
    """
    kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
    for text in ("description", "epilog"):  # often a docstring: its markup is not shown
        if kwargs.get(text):
            kwargs[text] = plain(kwargs[text])
    parser = argparse.ArgumentParser(prog=_INVOKED_AS[-1] if _INVOKED_AS else prog, **kwargs)
    parser.add_argument(
        "--version", action="version", version=f"dressage {version()}", help="print the version"
    )
    return parser


class RenamedFlag(argparse.Action):
    """The old spelling of a renamed flag: it still sets the new flag's value, and logs one
    deprecation warning naming the new spelling.

        p.add_argument("--engine-timeout", action=RenamedFlag, new="--engine-timeout-sec",
                       dest="engine_timeout_s", type=float)
    """

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any):
        kwargs.setdefault("help", f"deprecated spelling of {new}")
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        logging.getLogger(__name__).warning(
            "%s: %s is deprecated; use %s", parser.prog, option_string, self.new
        )
        setattr(namespace, self.dest, values)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model that holds the last key of ``loc`` (dict keys and list indexes
    skipped), or None when the path leaves the models."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
            continue
        current = _inner_model(current)
        if current is None:
            return None
    current = _inner_model(current) if not _is_model(current) else current
    return current if _is_model(current) else None


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _inner_model(tp: Any) -> Any:
    """The model inside ``dict[str, M]``, ``list[M]`` or ``M | None``."""
    if _is_model(tp):
        return tp
    for arg in typing.get_args(tp):
        if _is_model(arg):
            return arg
    if isinstance(tp, types.UnionType):
        return next((a for a in typing.get_args(tp) if _is_model(a)), None)
    return None


def _shown(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict | list):
        return f"a JSON {'object' if isinstance(value, dict) else 'list'}"
    return repr(value)


def _slime_spelling(model: type[BaseModel] | None, word: str) -> tuple[str, str] | None:
    """(key, slime's flag) when ``word`` is slime's spelling of a key of ``model`` (its
    ``SLIME_SPELLINGS``: key -> flag), as ``tensor_model_parallel_size`` is of ``tp_size``."""
    spellings: Mapping[str, str] = getattr(model, "SLIME_SPELLINGS", {})
    said = word.lstrip("-").replace("-", "_")
    return next(
        ((key, flag) for key, flag in spellings.items() if flag[2:].replace("-", "_") == said),
        None,
    )


def error_message(err: Mapping[str, Any], model: type[BaseModel]) -> str:
    """What one pydantic error says of its field, as the rest of a sentence that names it:
    ``is required``, ``is not a known key (did you mean 'load'?)``, ``must be ..., got X``."""
    loc = err["loc"]
    kind = err["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        owner = _model_at(model, loc)
        known = sorted(owner.model_fields) if owner else []
        hint = did_you_mean(str(loc[-1]), known) if loc else ""
        spelled = _slime_spelling(owner, str(loc[-1])) if loc else None
        if spelled:
            key, flag = spelled
            hint = f" (did you mean {key!r}, slime's {flag}?)"
        return f"is not a known key{hint}"
    if kind in {"dict_type", "model_type"}:
        return f"must be a JSON object, got {_shown(err['input'])}"
    msg = str(err["msg"])
    msg = (msg[0].lower() + msg[1:]).replace("input should be", "should be") if msg else msg
    return f"{msg}, got {_shown(err['input'])}"


def validation_sentences(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    name: Callable[[Sequence[str | int]], str],
) -> list[str]:
    """One sentence per error of ``exc`` (raised validating ``model``), naming the field as
    ``name(loc)`` does (a flag, a config key), with "did you mean" for a misspelled key; no
    pydantic type names, no links."""
    return [
        f"{name(err['loc'])} {error_message(err, model)}" for err in exc.errors(include_url=False)
    ]
