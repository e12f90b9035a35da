"""Write ``data/double.jsonl``: "Double N." rows, half for each kind of agent.

python examples/third_task/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

AGENTS = ("third_task.agent.run", "cmd: python3 -m third_task.command_agent")


def main() -> None:
    rng = random.Random(0)
    out = Path(__file__).parent / "data" / "double.jsonl"
    out.parent.mkdir(exist_ok=True)
    with out.open("w") as fh:
        for i in range(64):
            n = rng.randint(2, 60)
            row = {
                "id": f"double-{i:03d}",
                "input": f"Double {n}. Reply with the number only.",
                "label": str(2 * n),
                "metadata": {"task": "double", "agent": AGENTS[i % 2], "max_turns": 1},
            }
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
