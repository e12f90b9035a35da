"""
### dressage_rl: GRPO with partial rollout, end to end

**validate** the config (datasets, reward modules, routes) and the student checkpoint →
**start_services**: the embedded engine and the recording proxy with partial rollout (a setup
task; on the `ray` backend they run inside the job) → **prepare_job** writes `run.json` →
**train**: the async GRPO job, generation paused at a token boundary around each weight update
and every token stamped with its weight version, awaited by a deferrable operator → **stage**
the artifacts (manifest last) → pandera **checks** of segments and train data → **publish** the
`dressage_rl_segments` / `dressage_rl_train_data` Assets. **stop_services** runs whatever happens.

Run it from the trigger form, or `airflow dags test dressage_rl --conf '{"steps": 8}'`. The
config has the MOPD config's format; GRPO uses its datasets and reward modules, not its teachers.
"""

from __future__ import annotations

from pathlib import Path

from dressage.airflow.assets import RL_SEGMENTS, RL_TRAIN_DATA
from dressage.airflow.training_dag import training_dag

dag = training_dag(
    dag_id=Path(__file__).stem,
    objective="grpo",
    outlets=[RL_SEGMENTS, RL_TRAIN_DATA],
    description="GRPO with partial rollout: validate, serve, train (deferred), stage, check",
    doc_md=__doc__,
    schedule=None,
    tags=["dressage", "rl", "grpo", "training"],
)
