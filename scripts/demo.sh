#!/usr/bin/env bash
# The main job: dressage_mopd end to end on the embedded default, through Airflow.
#
#   bash scripts/demo.sh                 # or: make demo
#   bash scripts/demo.sh --steps 16      # more steps; --conf '{...}' for any other Param
#
# Installs .venv on first use (scripts/bootstrap.sh), keeps Airflow's SQLite metadata in
# ./airflow_home, runs the DAG with dag.test() (dressage.airflow.demo) showing each task and the
# training job's progress, and ends with the summary and the path of the curves PNG. Run files go
# to runs/demo/, staged artifacts to runs/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh

export AIRFLOW_HOME="$PWD/airflow_home"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
export PATH="$PWD/.venv/bin:$PATH"
# The engine, the proxy and the trainer share the machine's cores: one intra-op thread each
# (torch's default is one per core) keeps them from waiting on each other at every operation;
# on 2 cores a training step of the demo took 3x longer with the default.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mkdir -p "$AIRFLOW_HOME"

exec .venv/bin/python -m dressage.airflow.demo "$@"
