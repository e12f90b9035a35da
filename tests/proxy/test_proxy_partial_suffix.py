"""The streamed text's held-back tail: :func:`_partial_suffix` finds the longest tail that is a
marker or the start of one, looking only where a marker's first character is (the streaming
hot path), and says what the plain search over every tail length says."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dressage.proxy.streaming import _partial_suffix

MARKERS = ("</think>", "<tool_call>", "<|im_end|>", "\n\n", "STOP", "<")


def _every_tail(text: str, markers: tuple[str, ...]) -> int:
    best = 0
    for marker in markers:
        for k in range(min(len(marker), len(text)), 0, -1):
            if marker.startswith(text[-k:]) and (k < len(marker) or text.endswith(marker)):
                best = max(best, k)
                break
    return best


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="<>/|_thinkoSTP\n ab", max_size=30), st.sets(st.sampled_from(MARKERS)))
def test_the_tail_is_the_plain_searchs(text: str, markers: set[str]) -> None:
    chosen = tuple(sorted(markers))
    assert _partial_suffix(text, chosen) == _every_tail(text, chosen)


def test_examples() -> None:
    assert _partial_suffix("hello </thi", ("</think>",)) == 5
    assert _partial_suffix("done</think>", ("</think>",)) == 8
    assert _partial_suffix("a < b", ("<tool_call>",)) == 0
    assert _partial_suffix("x <tool_call", ("<tool_call>", "<|im_end|>")) == 10
    assert _partial_suffix("", ("</think>",)) == 0
