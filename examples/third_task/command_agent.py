"""An agent as a command: any program that reads its task on stdin and talks HTTP.

A dataset row names it as ``cmd: python3 -m third_task.command_agent`` (``examples/`` on
``PYTHONPATH``: a command runs in the job's folder, not the repository). The dispatch runs it
with ``OPENAI_BASE_URL`` set to the row's proxy session and ``OPENAI_API_KEY`` set, writes the
task (a JSON object: ``prompt``, ``sampling``, ...) to its stdin, and reads the answer from the
last line it prints, ``{"final_answer": ...}``. Standard library only, so that any ``python3``
runs it; an agent in another language works the same way.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

OPENAI_FIELDS = ("max_tokens", "temperature", "top_p", "seed", "stop")


def messages(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """The chat to send: the task's own message list, or a system prompt and the prompt."""
    if isinstance(prompt, list):
        return prompt
    return [
        {"role": "system", "content": "Reply with the final answer only."},
        {"role": "user", "content": prompt},
    ]


def main() -> int:
    task = json.loads(sys.stdin.read())
    sampling = task.get("sampling", {})
    body = {
        "model": task.get("model", "dressage"),
        "messages": messages(task["prompt"]),
        **{key: sampling[key] for key in OPENAI_FIELDS if key in sampling},
        "chat_template_kwargs": task.get("chat_template_kwargs", {}),
    }
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
        },
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())["choices"][0]["message"]["content"] or ""
    print(json.dumps({"final_answer": answer.strip()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
