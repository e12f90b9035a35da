"""What the tests and the benchmarks share, and nothing the running system imports.

- :mod:`~dressage.testing.tito_corpus`: the Qwen3.5 conversations that drift under naive
  re-tokenization, replayed by ``tests/proxy/tito`` and ``bench/tito.py``.
- :mod:`~dressage.testing.airflow_api`: Airflow's REST API as the trigger form drives it, for
  ``tests/e2e/test_airflow_ui.py`` and ``scripts/chaos.py``'s Airflow part.

The in-process servers for tests and scripts stay beside what they serve
(:mod:`dressage.engine.testing`, :mod:`dressage.proxy.testing`): the agents' evaluation runs on
them too, so they are not test support only.
"""
