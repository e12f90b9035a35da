"""A third task for the embedded default, added from outside ``dressage/`` (docs/guide-own-task.md).

    PYTHONPATH=$PWD/examples .venv/bin/dressage mopd check examples/third_task/mopd.json

``agent.py`` (an OpenAI-SDK agent), ``command_agent.py`` (a black-box command), ``reward.py``
(the task's reward, registered by name) and ``mopd.json`` (the two built-in tasks and this one,
each routed to a teacher); ``data/`` holds the rows, written by ``make_data.py``.
"""
