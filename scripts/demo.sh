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
mkdir -p "$AIRFLOW_HOME"

exec .venv/bin/python -m dressage.airflow.demo "$@"
