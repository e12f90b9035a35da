"""The recording proxy: an OpenAI-compatible front of the inference engine.

    dressage-proxy --engine-url http://127.0.0.1:30000 --store-dir ./proxy-store

Modules: ``server`` (app and routes), ``config`` (flags and DRESSAGE_PROXY_*), ``openai_api``
(requests and responses), ``sessions`` and ``turns`` (calls, steps, segments), ``streaming``
(deltas), ``encoding`` (the encode memo), ``generation_controller`` (every engine call),
``pause`` (rollout pause and resume around weight updates), ``engine_client`` and ``http1``
(the engine port), ``store`` (the durable log), ``client`` (``ProxyClient``), ``tito`` and
``parsers`` (token in/out, output parsing), ``testing`` (serving it in tests, a scripted engine).
"""
