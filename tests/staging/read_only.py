"""A folder nothing can be written into, for the read-only artifact root tests.

Permission bits do not stop root, so as root the folder gets the immutable attribute
(``chattr +i``); where that is not allowed either the test is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[Path]:
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
        return
    result = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot make a read-only folder as root here: {result.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
