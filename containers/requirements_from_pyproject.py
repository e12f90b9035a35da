"""Print dressage's runtime requirements from pyproject.toml, minus what an image brings itself.

    python containers/requirements_from_pyproject.py --exclude torch transformers > req.txt
    python containers/requirements_from_pyproject.py --names-only --exclude numpy > req.txt

The Dockerfiles use it so that pyproject.toml stays the one place where versions are pinned:
the Airflow and proxy images install the light pins without torch (the CPU pin would pull a
multi-GB build into images that never run a model); the trainer image installs names only,
constrained by the slime image's own versions, then ``pip install --no-deps`` dressage itself.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(*, exclude: set[str], names_only: bool, path: Path = PYPROJECT) -> list[str]:
    deps = tomllib.loads(path.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        name = re.split(r"[\s\[=<>!~;]", dep, maxsplit=1)[0].lower()
        if name in exclude:
            continue
        out.append(re.split(r"[=<>!~;]", dep, maxsplit=1)[0].strip() if names_only else dep)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exclude", nargs="*", default=[], help="distribution names to leave out")
    parser.add_argument("--names-only", action="store_true", help="drop the version pins")
    args = parser.parse_args(argv)
    exclude = {name.lower() for name in args.exclude}
    print("\n".join(requirements(exclude=exclude, names_only=args.names_only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
