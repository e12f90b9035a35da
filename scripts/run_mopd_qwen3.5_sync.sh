#!/usr/bin/env bash
# Multi-teacher on-policy distillation (MOPD) of a Qwen3.5 student on slime, synchronous recipe.
#
#   DRY_RUN=1 bash scripts/run_mopd_qwen3.5_sync.sh            # validate, print the command
#   bash scripts/run_mopd_qwen3.5_sync.sh                      # validate, ray job submit
#   LAUNCH=exec bash scripts/run_mopd_qwen3.5_sync.sh          # validate, run here (in a Ray job)
#   bash scripts/run_mopd_qwen3.5_sync.sh --num-rollout 50 -- --lr 1e-6   # launcher flags, then slime's
#
# The script has no defaults of its own. Each setting is the launcher's
# (python -m dressage.launch.slime_command, the same builder the Airflow DAG's Ray job uses):
# a flag before -- wins over its variable (DRESSAGE_MOPD_CONFIG, OUTPUT_DIR, TP_SIZE,
# NUM_ROLLOUT, ROLLOUT_BATCH_SIZE, ...), and the variable over the launcher's default
# (docs/settings.md; `dressage env` lists the variables). A Qwen3.5 student on one 8-GPU node,
# for example:
#
#   DRESSAGE_MOPD_CONFIG=/mnt/nfs/mopd.json OUTPUT_DIR=/mnt/nfs/runs/qwen3.5-sync \
#   HF_CHECKPOINT=/mnt/nfs/qwen3.5-4b TP_SIZE=2 NUM_ROLLOUT=200 ROLLOUT_BATCH_SIZE=64 \
#   MAX_TOKENS_PER_GPU=16384 MODEL_ARGS="$(...)" bash scripts/run_mopd_qwen3.5_sync.sh
#
# The script's own variables: MODEL_ARGS (the student's Megatron architecture flags, e.g. the
# output of slime's scripts/models/*.sh, passed after --), DRY_RUN=1 (print the command),
# LAUNCH=exec (run it here instead of submitting it), CHECK_IMPORTS=0 (--no-check-imports) and
# PYTHON (the interpreter: .venv/bin/python when there is one, else python3).
# The launcher refuses more than one sample per prompt, contradicting options and incompatible
# checkpoints, naming each. Credentials (WANDB_API_KEY, the MOPD config's runtime_env_keys) are
# read from the environment and forwarded through the Ray runtime env file, never put on the
# command line.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do  # the launcher's flags, up to --
    args+=("$1")
    shift
done
[ "${1:-}" = -- ] && shift

[ "${CHECK_IMPORTS:-1}" = 0 ] && args+=(--no-check-imports)
if [[ " ${args[*]} " =~ \ --(dry-run|exec|submit)\  ]]; then
    :  # a mode given as a flag wins
elif [ "${DRY_RUN:-0}" = 1 ]; then
    args+=(--dry-run)
elif [ "${LAUNCH:-submit}" = exec ]; then
    args+=(--exec)
else
    args+=(--submit)
fi

read -r -a model_args <<< "${MODEL_ARGS:-}"
exec "$PYTHON" -m dressage.launch.slime_command "${args[@]}" -- "${model_args[@]}" "$@"
