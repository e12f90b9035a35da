"""The embedded engine: an SGLang-compatible subset of the HTTP API over a transformers model.

    dressage engine serve --model PATH             # see dressage.engine.cli
    from dressage.engine.testing import serve_engine  # a real server for tests and scripts

Modules: ``server`` (routes), ``service`` (asyncio side: gate, pause, weight updates),
``scheduler`` (the continuous-batching thread), ``model_runner`` (model, prefill/decode),
``kv_cache`` (slot KV cache + attention), ``sampling`` (lm_head + sampler), ``protocol`` (wire
format), ``request`` (per-request state), ``config``.
"""

from dressage.engine.config import EngineConfig

__all__ = ["EngineConfig"]
