"""Small segment tables for the staging tests: ``n`` four-token segments, the last two trainable."""

from __future__ import annotations

from dressage.trajectory import Segment


def segments(n: int, session: str = "s", *, one_session: bool = True) -> list[Segment]:
    """``n`` segments of one session (indices ``0 .. n-1``), or with ``one_session=False`` of
    ``n`` sessions ``{session}-{i}`` (one segment each); segment ``i`` has tokens ``1 2 3 4+i``."""
    return [
        Segment(
            session_id=session if one_session else f"{session}-{i}",
            segment_index=i if one_session else 0,
            tokens=[1, 2, 3, 4 + i],
            full_loss_mask=[0, 0, 1, 1],
            full_logprobs=[0.0, 0.0, -0.5, -0.25],
            messages=[{"role": "user", "content": f"q{i}"}],
            finish_reason="stop",
            prompt_length=2,
        )
        for i in range(n)
    ]
