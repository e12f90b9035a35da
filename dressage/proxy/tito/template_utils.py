"""Pinned chat templates: load, compile and render them exactly as transformers would.

The templates in ``templates/`` are written by this project from the format facts
(``docs/qwen-chat-format.md`` for Qwen) and never change under a tokenizer's feet.
They run in the same Jinja environment as ``transformers``' ``apply_chat_template`` (sandboxed,
``trim_blocks``, ``lstrip_blocks``, a ``tojson`` that does not escape HTML), so a tokenizer that
carries one as its ``chat_template`` renders byte for byte what TITO renders::

    from dressage.proxy.tito.template_utils import load_pinned_template
    tokenizer.chat_template = load_pinned_template("qwen3_5_fixed")

Besides the usual variables (``messages``, ``tools``, ``add_generation_prompt`` and the
``chat_template_kwargs``) they read ``continuation``: when true, ``messages`` extend a conversation
that is already rendered, so the opening (BOS, system and tools header) is left out. TITO renders
each turn's appended messages that way, with the same rules as a whole conversation.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "PINNED_TEMPLATES",
    "TemplateRenderError",
    "compile_template",
    "load_pinned_template",
    "render_template",
]

PINNED_TEMPLATES: dict[str, str] = {
    "qwen3.5": "qwen3_5_fixed",
    "qwen3": "qwen3_fixed",
    "llama3": "llama3_fixed",
    "deepseek": "deepseek_v3_fixed",
}
"""Family name → pinned template name (a file ``templates/<name>.jinja``)."""


class TemplateRenderError(ValueError):
    """The template refused the conversation (``raise_exception``) or failed to render it."""


def load_pinned_template(name: str) -> str:
    """Text of a pinned template, by template name (``qwen3_5_fixed``) or family (``qwen3.5``)."""
    stem = PINNED_TEMPLATES.get(name, name)
    path = resources.files("dressage.proxy.tito") / "templates" / f"{stem}.jinja"
    if not path.is_file():
        known = sorted(set(PINNED_TEMPLATES) | set(PINNED_TEMPLATES.values()))
        raise FileNotFoundError(f"no pinned template {name!r}; known: {known}")
    return path.read_text(encoding="utf-8")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


@functools.cache
def compile_template(text: str) -> jinja2.Template:
    """Compile once per template text (compiled templates are cached and reused)."""
    return _environment().from_string(text)


def render_template(template: jinja2.Template, **variables: Any) -> str:
    """Render, turning any template failure into :class:`TemplateRenderError`.

    What ``template.render`` does, and then the render's context forgets its variables: a
    template's macros are closures over that context, a reference cycle of some 40 objects a
    render that only the cyclic GC would free (its collections were a tenth of the proxy's CPU)."""
    environment = template.environment
    context = template.new_context(dict(variables))
    try:
        try:
            return str(environment.concat(template.root_render_func(context)))
        except Exception:
            environment.handle_exception()  # re-raised with the template's lines, as render does
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateRenderError(str(exc)) from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise TemplateRenderError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        context.vars.clear()
