#!/usr/bin/env bash
# Airflow standalone with the dressage DAGs, on http://127.0.0.1:8080 (Ctrl-C stops all of it).
#
#   bash scripts/airflow.sh              # or: make airflow;  AIRFLOW_PORT=8081 to move it
#
# SQLite metadata in ./airflow_home (shared with `make demo`; DRESSAGE_AIRFLOW_HOME moves it),
# LocalExecutor with parallelism 2,
# the API bound to loopback. Sign in as "admin"; the password is generated on the first start
# into airflow_home/simple_auth_manager_passwords.json.generated. Trigger dressage_mopd from
# its form (Trigger -> the Params; "Advanced" holds the rest). Standalone starts its parts as
# `airflow ...` from PATH, hence the venv's bin first; it runs in its own process group so that
# stopping it stops the scheduler, triggerer, dag-processor and api-server with it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh

export AIRFLOW_HOME="${DRESSAGE_AIRFLOW_HOME:-$PWD/airflow_home}"
export PATH="$PWD/.venv/bin:$PATH"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$PWD/plugins"   # run notes, the curves route
export AIRFLOW__CORE__PARALLELISM=2
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="${AIRFLOW_PORT:-8080}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:${AIRFLOW__API__PORT}/execution/"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
mkdir -p "$AIRFLOW_HOME"

# A long JWT secret and the Fernet key, kept (mode 0600) beside the DB; `make demo` uses the
# same Fernet key file.
secret_file="$AIRFLOW_HOME/.jwt_secret"
if [ ! -s "$secret_file" ]; then
    (umask 077 && .venv/bin/python -c "import secrets; print(secrets.token_hex(32))" > "$secret_file")
fi
fernet_file="$AIRFLOW_HOME/.fernet_key"
if [ ! -s "$fernet_file" ]; then
    (umask 077 && .venv/bin/python -c \
        "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())" \
        > "$fernet_file")
fi
AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$secret_file")"
AIRFLOW__CORE__FERNET_KEY="$(cat "$fernet_file")"
export AIRFLOW__API_AUTH__JWT_SECRET AIRFLOW__CORE__FERNET_KEY

echo "Airflow UI: http://127.0.0.1:${AIRFLOW__API__PORT}  (user admin; password in" \
     "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"

setsid airflow standalone &
pid=$!
stop() {
    trap - INT TERM EXIT
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 -- "-$pid" 2>/dev/null || return 0; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
}
trap stop INT TERM EXIT
wait "$pid"
