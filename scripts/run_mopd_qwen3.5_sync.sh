#!/usr/bin/env bash
# Multi-teacher on-policy distillation (MOPD) of a Qwen3.5 student on slime, synchronous recipe.
#
#   DRY_RUN=1 bash scripts/run_mopd_qwen3.5_sync.sh            # validate, print the command
#   bash scripts/run_mopd_qwen3.5_sync.sh                      # validate, ray job submit
#   LAUNCH=exec bash scripts/run_mopd_qwen3.5_sync.sh          # validate, run here (in a Ray job)
#   bash scripts/run_mopd_qwen3.5_sync.sh -- --lr 1e-6 ...     # more slime/Megatron flags
#
# Every value below can be set from the environment. The command itself is built and checked by
# dressage.launch.slime_command (the same builder the Airflow DAG's Ray job uses): it refuses more
# than one sample per prompt, contradicting options and incompatible checkpoints, naming each.
# Credentials (WANDB_API_KEY, the MOPD config's runtime_env_keys) are read from the environment
# and forwarded through the Ray runtime env file, never put on the command line.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

DRESSAGE_MOPD_TEACHER_CONFIG=${DRESSAGE_MOPD_TEACHER_CONFIG:-configs/mopd/mopd_alfworld_hotpotqa.example.json}
OUTPUT_DIR=${OUTPUT_DIR:-runs/mopd-qwen3.5-sync}
TP_SIZE=${TP_SIZE:-2}
CP_SIZE=${CP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
NUM_NODES=${NUM_NODES:-1}
NUM_GPUS=${NUM_GPUS:-8}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-64}
N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))}
NUM_ROLLOUT=${NUM_ROLLOUT:-200}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-16384}
SEED=${SEED:-1234}
ROLLOUT_SEED=${ROLLOUT_SEED:-42}
USE_WANDB=${USE_WANDB:-0}
WANDB_PROJECT=${WANDB_PROJECT:-dressage-mopd}
WANDB_GROUP=${WANDB_GROUP:-qwen3.5-sync}
# Megatron architecture flags of the student (e.g. the output of slime's scripts/models/*.sh).
MODEL_ARGS=${MODEL_ARGS:-}

args=(
    --mopd-config "$DRESSAGE_MOPD_TEACHER_CONFIG"
    --output-dir "$OUTPUT_DIR"
    --tp-size "$TP_SIZE" --cp-size "$CP_SIZE" --pp-size "$PP_SIZE"
    --actor-num-nodes "$NUM_NODES" --actor-num-gpus-per-node "$NUM_GPUS" --colocate
    --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES_PER_PROMPT"
    --global-batch-size "$GLOBAL_BATCH_SIZE"
    --num-rollout "$NUM_ROLLOUT"
    --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --seed "$SEED" --rollout-seed "$ROLLOUT_SEED"
)
[ -n "${HF_CHECKPOINT:-}" ] && args+=(--hf-checkpoint "$HF_CHECKPOINT")
[ -n "${REF_LOAD:-}" ] && args+=(--ref-load "$REF_LOAD")
case "$USE_WANDB" in
    1|true|yes|on) args+=(--use-wandb --wandb-project "$WANDB_PROJECT" --wandb-group "$WANDB_GROUP") ;;
    *) args+=(--no-use-wandb) ;;
esac
[ "${CHECK_IMPORTS:-1}" = 0 ] && args+=(--no-check-imports)

if [ "${DRY_RUN:-0}" = 1 ]; then
    args+=(--dry-run)
elif [ "${LAUNCH:-submit}" = exec ]; then
    args+=(--exec)
else
    args+=(--submit)
fi

[ "${1:-}" = -- ] && shift
read -r -a model_args <<< "$MODEL_ARGS"
exec "$PYTHON" -m dressage.launch.slime_command "${args[@]}" -- "${model_args[@]}" "$@"
