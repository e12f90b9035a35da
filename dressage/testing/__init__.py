"""What the tests and the benchmarks share, and nothing the running system imports.

- :mod:`~dressage.testing.tito_corpus`: the Qwen3.5 conversations that drift under naive
  re-tokenization, replayed by ``tests/proxy/tito`` and ``bench/tito.py``.

The in-process servers for tests and scripts stay beside what they serve
(:mod:`dressage.engine.testing`, :mod:`dressage.proxy.testing`): the agents' evaluation runs on
them too, so they are not test support only.
"""
