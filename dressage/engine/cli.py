"""``dressage engine serve``: run the embedded SGLang-compatible engine.

    DRESSAGE_ENGINE_ADMIN_KEY=KEY dressage engine serve --model PATH [--tokenizer PATH]
        [--host 127.0.0.1] [--port 30000] [--device auto|cpu|cuda] [--weight-version default]

``--port 0`` picks a free port. Once the engine accepts requests it prints one line,
``DRESSAGE_ENGINE_URL=http://HOST:PORT``, which :func:`dressage.engine.testing.serve_engine`
(subprocess mode) and scripts can wait for, and logs one line on stderr saying so (the URL, the
model, its weight version), at info level whatever ``--log-level`` says.

Keys come from the environment: ``DRESSAGE_ENGINE_ADMIN_KEY`` guards the control routes (pause,
abort, weight updates; the proxy and the training job read the same variable), and
``DRESSAGE_ENGINE_API_KEY``, when set, every route but health. SGLang's ``--admin-api-key`` and
``--api-key`` flags are accepted too and win over the variables, but a flag shows the key to
anyone who can list processes. Without a control key the engine refuses to start (exit 2),
unlike SGLang, whose control routes are open by default; ``--open-control-routes`` serves them
without one, on a loopback host only. A variable that is set but empty is an error, not "no key".
"""

from __future__ import annotations

import argparse
import gc
import logging
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from dressage.commands import command_parser
from dressage.config.layered import LayeredSettings
from dressage.engine.config import ADMIN_KEY_ENV, API_KEY_ENV, EngineConfig

READY_PREFIX = "DRESSAGE_ENGINE_URL="
READY_LOGGER = "dressage.engine.ready"
"""The logger of the one info line (on stderr) that says the engine serves, and where."""


def _parser() -> argparse.ArgumentParser:
    p = command_parser("python -m dressage.engine.cli", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        "--model-path",
        dest="model_path",
        required=True,
        help="the model's Hugging Face folder",
    )
    p.add_argument(
        "--tokenizer",
        "--tokenizer-path",
        dest="tokenizer_path",
        help="the tokenizer's folder (default: the model's)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to serve on")
    p.add_argument("--port", type=int, default=30000, help="port to serve on")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument(
        "--weight-version", default="default", help="the version the first weights report"
    )
    p.add_argument("--api-key", help=f"key of every route but health (prefer {API_KEY_ENV})")
    p.add_argument("--admin-api-key", help=f"key of the control routes (prefer {ADMIN_KEY_ENV})")
    p.add_argument(
        "--open-control-routes",
        action="store_true",
        help="serve pause, abort and weight updates without a key (loopback only; for tests)",
    )
    p.add_argument(
        "--served-model-name",
        help="the model name the API reports (SGLang's; default: the --model folder)",
    )
    p.add_argument(
        "--context-length", type=int, help="most tokens of a sequence (default: the model's)"
    )
    p.add_argument(
        "--max-running-requests",
        type=int,
        help="requests decoded at once (default: 64 on CPU, 256 on a GPU)",
    )
    p.add_argument(
        "--max-total-tokens",
        type=int,
        help="KV budget in token positions (default: what the device's memory holds)",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        help="most prompt tokens a prefill batch (default: 8192 on CPU, 16384 on a GPU)",
    )
    p.add_argument(
        "--num-threads", type=int, help="CPU threads for the lm_head pass (default: all cores)"
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=16 * 1024 * 1024, help="largest request body"
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    return p


def config_from_args(argv: Sequence[str]) -> tuple[EngineConfig, str]:
    """Flags over ``DRESSAGE_ENGINE_*`` keys; ValueError for settings that cannot run."""
    args = vars(_parser().parse_args(list(argv)))
    log_level = args.pop("log_level")
    keys = EngineKeys.layered(
        {"api_key": args["api_key"], "admin_api_key": args["admin_api_key"]},
        given_as={"api_key": "--api-key", "admin_api_key": "--admin-api-key"},
    )
    for field in ("api_key", "admin_api_key"):
        if args[field] is None:  # a flag given, even empty, is the key (EngineConfig refuses "")
            args[field] = getattr(keys, field)
    return EngineConfig(**args), log_level


def check_folders(config: EngineConfig) -> None:
    """The model and tokenizer folders exist (a ValueError naming the flag): said before torch
    and transformers load, not as their traceback."""
    model, tokenizer = Path(config.model_path), config.tokenizer_path
    if not (model / "config.json").is_file():
        what = "no config.json in it" if model.is_dir() else "no such folder"
        raise ValueError(f"--model {model}: {what} (a Hugging Face model folder)")
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise ValueError(f"--tokenizer {tokenizer}: no such folder")


class EngineKeys(LayeredSettings):
    """The engine's keys: a flag over its variable (a variable set but empty is an error)."""

    ENV: ClassVar[Mapping[str, str]] = {"api_key": API_KEY_ENV, "admin_api_key": ADMIN_KEY_ENV}
    SECRETS: ClassVar[frozenset[str]] = frozenset({"api_key", "admin_api_key"})
    WHAT: ClassVar[str] = "engine keys"

    api_key: str | None = None
    admin_api_key: str | None = None


def serve_main(argv: Sequence[str]) -> int:
    """Entry point of ``dressage engine serve`` (see the module docstring)."""
    import uvicorn

    from dressage.engine.server import create_app

    try:
        config, log_level = config_from_args(argv)
        check_folders(config)
    except ValueError as exc:  # before the model loads: a refusal costs nothing
        print(f"dressage engine serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    ready_log = logging.getLogger(READY_LOGGER)
    ready_log.setLevel(logging.INFO)  # said whatever --log-level says of the rest
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host

    url = f"http://{host}:{port}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)  # the socket listens: /health answers now
            if not self.should_exit:
                print(f"{READY_PREFIX}{url}", flush=True)
                ready_log.info(
                    "dressage engine ready at %s: model %s, weight version %s",
                    url, config.model_path, config.weight_version,
                )  # fmt: skip

    app = create_app(config)
    # The model, tokenizer and app live as long as the process: keep them out of the cyclic
    # GC's full collections, which would otherwise stall a decode step (and a pause).
    gc.collect()
    gc.freeze()
    server = _Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
