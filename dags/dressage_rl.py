"""
### dressage_rl: GRPO with partial rollout, end to end

**plan** checks the form's values and fixes the run's folders → **prepare** builds the tiny
teachers not built yet (`tiny-sft:` only, once) → **validate** the config
(datasets, reward modules, routes) and the student checkpoint → **start_services**: the
embedded engine and the recording proxy with partial rollout (a setup task; on the `ray`
backend they run inside the job) → **prepare_job** writes `run.json` → **train**: the async
GRPO job, generation paused at a token boundary around each weight update and every token
stamped with its weight version, awaited by a deferrable operator; its log ends with the run's
summary (reward, pass rate per task, advantages) → **stage** the curves and the artifacts
(manifest last) → pandera checks of segments (**check_segments**) and train data
(**check_train_data**) → **publish** the `dressage_rl_segments` / `dressage_rl_train_data`
Assets and the trained student (`dressage_rl_student`). **stop_services** runs whatever happens.

When the run ends, its note holds the summary and the curves, or the reason it failed. Run it
from the trigger form, or `airflow dags test dressage_rl --conf '{"steps": 8}'`. The config has
the MOPD config's format; GRPO uses its datasets and reward modules, not its teachers.
**Continue from** (`continue_from`: `fresh`, `latest` or a checkpoint) works as in
`dressage_mopd`.
"""

from __future__ import annotations

from pathlib import Path

from dressage.airflow.assets import RL_SEGMENTS, RL_STUDENT, RL_TRAIN_DATA
from dressage.airflow.training_dag import training_dag

dag = training_dag(
    dag_id=Path(__file__).stem,
    objective="grpo",
    outlets=[RL_SEGMENTS, RL_TRAIN_DATA, RL_STUDENT],
    description="GRPO, partial rollout: validate, serve, train (deferred), stage, check, publish",
    doc_md=__doc__,
    schedule=None,
    tags=["dressage", "rl", "grpo", "training"],
)
