"""A Qwen3.5 corpus of agent conversations that drift under naive re-tokenization.

Each conversation is scripted the way real rollouts go wrong for a proxy that re-renders and
re-tokenizes the whole conversation every turn: a model that samples a word in two pieces after a
tool output cut it mid-word, trailing whitespace an agent strips, code and CJK sampled off the
canonical BPE path, an output cut off inside an emoji's bytes, numbers and JSON arguments that a
parser normalises, and reasoning that the stock template drops from earlier turns or that the
OpenAI SDK does not send back. ``tests/proxy/tito`` and ``bench/tito.py`` replay it::

    from dressage.testing.tito_corpus import qwen35_drift_corpus
"""

from __future__ import annotations

from typing import Any

from dressage.proxy.tito.replay import ScriptedConversation, ScriptedTurn

__all__ = [
    "TOOLS",
    "WEATHER_TOOL",
    "drop_history_reasoning",
    "qwen35_drift_corpus",
    "sdk_echo",
    "strip_echo",
]


def _tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": properties},
        },
    }


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TOOLS = [
    _tool("read_file", {"path": {"type": "string"}}),
    _tool("run", {"cmd": {"type": "string"}}),
    _tool("set_price", {"item": {"type": "string"}, "price": {"type": "number"}, "qty": {}}),
    _tool("configure", {"options": {"type": "object"}}),
]


def _think(reasoning: str) -> str:
    return reasoning + "\n</think>\n\n"


def _call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def _tool_result(content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_0", "content": content}


def _user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def sdk_echo(message: dict[str, Any]) -> dict[str, Any]:
    """What an OpenAI SDK agent sends back: no ``reasoning_content``."""
    return {k: v for k, v in message.items() if k != "reasoning_content"}


def strip_echo(message: dict[str, Any]) -> dict[str, Any]:
    """An agent that strips the text it shows (and stores)."""
    content = message.get("content")
    return {**message, "content": content.strip() if isinstance(content, str) else content}


def drop_history_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stock template's rule: reasoning survives only after the last user query."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    return [
        {k: v for k, v in m.items() if k != "reasoning_content"}
        if m["role"] == "assistant" and i < last_user
        else m
        for i, m in enumerate(messages)
    ]


def _start(user: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a careful coding agent."}, _user(user)]


def qwen35_drift_corpus() -> list[ScriptedConversation]:
    """The corpus: one or more conversations per drift category."""
    turn = ScriptedTurn
    return [
        ScriptedConversation(
            name="log cut mid-word",
            category="tool_output_mid_word",
            messages=_start("Why does the app warn at startup?"),
            tools=TOOLS,
            turns=[
                turn(
                    [_think("Read the log."), _call("read_file", path="/var/log/app.log")],
                    follow_up=[_tool_result("INFO start\nWARN missing key 'internationaliz")],
                ),
                turn(
                    [
                        'The log stops inside "internationaliz',
                        'ation", so the key is internationaliz',
                        "ation.\n</think>\n\nThe key `internationaliz",
                        "ation` is missing from the config.",
                    ],
                    follow_up=[_user("Thanks, fixed.")],
                ),
                turn([_think("Close."), "Good to hear."]),
            ],
        ),
        ScriptedConversation(
            name="trailing spaces stripped by the agent",
            category="trailing_whitespace",
            messages=_start("List two steps.  \n"),
            echo=strip_echo,
            turns=[
                turn(
                    [_think("Two lines."), "1. build  \n", "2. test \n\n"],
                    follow_up=[_user("And a third?\n\n")],
                ),
                turn([_think("One more."), "3. ship   "]),
            ],
        ),
        ScriptedConversation(
            name="code written token by token",
            category="code",
            messages=_start("Write add() and run it."),
            tools=TOOLS,
            turns=[
                turn(
                    [
                        _think("Write the function, then run it."),
                        "```python\ndef add(a, b):\n",
                        "    ",
                        "return a",
                        " + b\n```\n\n",
                        _call("run", cmd="python -c 'print(1+1)'"),
                    ],
                    follow_up=[_tool_result("2\n")],
                ),
                turn([_think("It printed 2."), "It prints `2`", "."]),
            ],
        ),
        ScriptedConversation(
            name="CJK sampled character by character",
            category="cjk",
            messages=_start("把 hello world 翻译成中文。"),
            turns=[
                turn(
                    [_think("翻译。"), "你", "好", "，", "世", "界", "。"],
                    follow_up=[_user("谢谢")],
                ),
                turn([_think("客气。"), "不客", "气！"]),
            ],
        ),
        ScriptedConversation(
            name="output cut inside an emoji",
            category="emoji",
            messages=_start("Celebrate with an emoji."),
            turns=[
                turn(
                    [_think("An emoji."), "Party time ", b"\xf0\x9f\x8e"],
                    stopped=False,
                    follow_up=[_user("Go on.")],
                ),
                turn([_think("Finish it."), "🎉", " Done 👍🏽"]),
            ],
        ),
        ScriptedConversation(
            name="numbers normalised by the parser",
            category="numbers",
            messages=_start("Set the price of tea to 2.50, quantity 007."),
            tools=TOOLS,
            turns=[
                turn(
                    [
                        _think("Call set_price."),
                        _call("set_price", item="tea", price="2.50", qty="007"),
                    ],
                    follow_up=[_tool_result("ok: 2.5 x 7 = 17.5")],
                ),
                turn([_think("Done."), "Tea now costs 2.50 (total 17.50)."]),
            ],
        ),
        ScriptedConversation(
            name="compact JSON argument",
            category="json_arguments",
            messages=_start("Enable a and set b."),
            tools=TOOLS,
            turns=[
                turn(
                    [_think("One call."), _call("configure", options='{"a":true,"b":[1,2]}')],
                    follow_up=[_tool_result('{"status": "ok"}')],
                ),
                turn([_think("Applied."), "Both options are set."]),
            ],
        ),
        ScriptedConversation(
            name="reasoning of earlier turns",
            category="reasoning_history",
            messages=_start("What is 17 * 3?"),
            turns=[
                turn([_think("17 * 3 = 51."), "51"], follow_up=[_user("And 51 + 9?")]),
                turn([_think("51 + 9 = 60."), "60"], follow_up=[_user("Halve it.")]),
                turn([_think("60 / 2 = 30."), "30"]),
            ],
        ),
        ScriptedConversation(
            name="reasoning not echoed by an SDK agent",
            category="reasoning_history",
            messages=_start("Read config.toml and summarise it."),
            tools=TOOLS,
            echo=sdk_echo,
            turns=[
                turn(
                    [_think("Read the file first."), _call("read_file", path="config.toml")],
                    follow_up=[_tool_result('[server]\nport = 8080\nhost = "0.0.0.0"\n')],
                ),
                turn([_think("Port and host."), "It serves on 0.0.0.0:8080."]),
            ],
        ),
        ScriptedConversation(
            name="thinking off, empty think block not echoed",
            category="thinking_off",
            messages=_start("Say hi."),
            chat_template_kwargs={"enable_thinking": False},
            echo=sdk_echo,
            turns=[
                turn(["Hi", "!"], follow_up=[_user("Again.")]),
                turn(["Hi again", "!"]),
            ],
        ),
        ScriptedConversation(
            name="answer cut by max_tokens",
            category="truncated_output",
            messages=_start("Count to five."),
            turns=[
                turn([_think("Count."), "1, 2, 3"], stopped=False, follow_up=[_user("Continue.")]),
                turn([_think("Go on."), "4, 5"]),
            ],
        ),
    ]
