"""Jobs the orchestration launches: ``python -m dressage.jobs.train --run-config RUN.json``.

``train`` (the entry point), ``options`` (RUN.json's ``advanced`` options and the slime-named
``args`` built from them), ``outputs`` (artifacts, ``metrics.jsonl``, ``summary.json``).
"""
