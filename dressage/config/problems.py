"""What validation reports: one :class:`Problem` per reason a run must not start, all at once.

A check collects every problem it finds instead of stopping at the first, so that one attempt
shows everything to fix; :class:`MopdConfigError` carries them when a caller must raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["MopdConfigError", "MopdReport", "Problem"]


@dataclass(frozen=True)
class Problem:
    """One reason a run must not start; ``subject`` names the teacher, dataset or option."""

    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


class MopdConfigError(ValueError):
    """Raised with every problem found, so one attempt shows everything to fix."""

    def __init__(self, problems: Sequence[Problem], *, source: str = "MOPD run") -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source} is invalid ({len(self.problems)} problem(s)):\n{lines}")


@dataclass
class MopdReport:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self, source: str = "MOPD run") -> None:
        if self.problems:
            raise MopdConfigError(self.problems, source=source)
