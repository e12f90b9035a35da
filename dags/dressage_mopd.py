"""
### dressage_mopd: multi-teacher on-policy distillation, end to end

**plan** checks the form's values (ranges, URLs: one sentence per value to fix) and fixes the
run's folders → **prepare** builds the tiny teachers the config names that are not built yet
(`tiny-sft:` only, once) → **validate** the MOPD config and checkpoints (fails closed, listing every
problem) → **start_services**: the embedded engine and the recording proxy (a setup task; on
the `ray` backend they run inside the job) → **prepare_job** writes the job's `run.json` →
**train**: the async MOPD training job, with generation paused around weight updates, awaited
by a deferrable operator (no worker slot while it trains); its log ends with the run's summary
→ **stage** the curves and the artifacts to the artifact root (manifest last, checksums
verified) → pandera checks of segments (**check_segments**) and train data
(**check_train_data**) → **publish** the `dressage_mopd_segments` / `dressage_mopd_train_data`
Assets and the trained student (`dressage_mopd_student`: its checkpoint, steps, held-out
accuracy and parent run). **stop_services** (teardown) runs whatever happens.

When the run ends, its note (on the run's page) holds the summary per teacher and the curves,
or, if it failed, the reason. Run it from the trigger form, or
`airflow dags test dressage_mopd --conf '{"steps": 8}'`. Backend `embedded` trains on this
machine; `ray` submits the job to the Ray cluster at `ray_address` (in "Job and cluster
settings"). To schedule it, set `DRESSAGE_MOPD_SCHEDULE` (a cron expression or preset, e.g.
`0 3 * * *`) where the DAG processor runs. **Continue from** (`continue_from`) says what a run
starts from: `fresh` (the config's student, from the first prompt), `latest` (the student the
last successful run published, with its data position; fresh when none was), or a checkpoint
folder or `file://` URL. Left empty, scheduled runs take `latest` and triggered runs `fresh`,
so a nightly schedule keeps training one student. A retry of **train** resumes the job from its
own last checkpoint (`save_interval` steps apart), not from the start.
"""

from __future__ import annotations

from pathlib import Path

from dressage.airflow.assets import MOPD_SEGMENTS, MOPD_STUDENT, MOPD_TRAIN_DATA
from dressage.airflow.params import schedule_from_env
from dressage.airflow.training_dag import training_dag

dag = training_dag(
    dag_id=Path(__file__).stem,
    objective="mopd",
    outlets=[MOPD_SEGMENTS, MOPD_TRAIN_DATA, MOPD_STUDENT],
    description="MOPD: plan, validate, serve, train (deferred), stage, check, publish",
    doc_md=__doc__,
    schedule=schedule_from_env(),
    tags=["dressage", "mopd", "training"],
)
