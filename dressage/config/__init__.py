"""Typed configuration: validated once at the edge, plain objects inside.

env.py            every DRESSAGE_* variable, its default and meaning (``dressage env``)
proxy.py          the recording proxy's settings (flags over variables over defaults)
tito_families.py  the TITO chat families' names, which the proxy's settings check
mopd.py           the MOPD config (teachers, datasets, reward modules) and its checks
mopd_files.py     reading a MOPD config file (placeholders, relative paths)
problems.py       what validation reports
layered.py        the one layering of flags over variables over defaults (pydantic-settings),
                  for the modules below and every command
pause_client.py   the trainer's pause client (pause around weight updates, required, timeout)
agent_dispatch.py the black-box rollout's agent dispatch (proxy, agent, timeouts, attempts)
proxy_access.py   the rollout's proxy URL and admin key (args over DRESSAGE_PROXY_*)
mopd_path.py      the MOPD config's path (a flag or args over DRESSAGE_MOPD_CONFIG)
run.py            a training run: a MOPD launch's settings (the MOPD objectives' names and
                  defaults; the launcher's flags over TP_SIZE, ...), an embedded job's RUN.json
job.py            RUN.json's ``advanced`` options (and the cluster's)
"""

from dressage.config import agent_dispatch as _agent_dispatch  # noqa: F401  (DRESSAGE_AGENT_*)
from dressage.config import pause_client as _pause_client  # noqa: F401  (DRESSAGE_PROXY_PAUSE_*)
from dressage.config import proxy as _proxy  # noqa: F401  (declares DRESSAGE_PROXY_*)
from dressage.config.env import ENV, EnvVar, env_bool, env_float, env_int, env_str

__all__ = ["ENV", "EnvVar", "env_bool", "env_float", "env_int", "env_str"]
