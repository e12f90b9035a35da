"""Rendering with a pinned template: failures become one sentence (:class:`TemplateRenderError`),
and a render leaves nothing for the cyclic GC (a template's macros are closures over the render's
context; the proxy renders every turn, and its GC pauses were that garbage)."""

from __future__ import annotations

import gc

import pytest

from dressage.proxy.tito.template_utils import (
    TemplateRenderError,
    compile_template,
    load_pinned_template,
    render_template,
)

MESSAGES = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix it."},
]


@pytest.mark.parametrize("name", ["qwen3_5_fixed", "qwen3_fixed", "llama3_fixed"])
def test_a_render_leaves_no_cyclic_garbage(name: str) -> None:
    template = compile_template(load_pinned_template(name))
    first = render_template(template, messages=MESSAGES, add_generation_prompt=True)
    assert first == template.render(messages=MESSAGES, add_generation_prompt=True)
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            assert render_template(template, messages=MESSAGES, add_generation_prompt=True) == first
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{{ raise_exception('no tools here') }}", "no tools here"),
        ("{{ messages[0].content + 1 }}", "TypeError"),
        ("{{ messages.pop() }}", "unsafe"),
    ],
)
def test_a_failing_render_is_one_sentence(text: str, message: str) -> None:
    with pytest.raises(TemplateRenderError, match=message):
        render_template(compile_template(text), messages=MESSAGES)
