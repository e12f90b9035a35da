#!/usr/bin/env bash
# What a GPU machine needs besides CUDA, PyTorch and transformers to run slime's Megatron actor:
# the GPU tier (tests/real_slime/test_megatron_gpu.py) and the benches that time steps through
# slime's actor (bench/teacher_rotation_slime.py, bench/mopd_objective_cost.py --backend slime).
# Gathered here, where pip reaches PyPI, into one folder that travels to a machine that reaches
# nothing:
#
#   SLIME_ROOT=... MEGATRON_LM_ROOT=... bash scripts/gpu_carry.sh .gpu-carry   # here
#   bash .gpu-carry/install.sh && . .gpu-carry/env.sh                           # there, in the repo
#
# The folder holds (about 30 MB):
# - wheels/: megatron-core (the pinned release), torch-memory-saver, numpy 1.x (slime's
#   initialisation refuses numpy 2), pydantic with what it needs (megatron.rl imports it),
#   pydantic-settings (dressage.config), orjson (dressage's JSON), a typing-extensions as new
#   as pydantic needs, and pytest with what it needs (the GPU tier is a pytest run), each for
#   the target's Python (--python, default 3.12, the slime image's), without their own
#   dependencies: PyTorch and transformers are the machine's;
# - slime/ and megatron-lm/: copies of SLIME_ROOT and MEGATRON_LM_ROOT (Megatron-LM's training
#   code at the tag of the pinned megatron-core);
# - install.sh: installs the wheels into /tmp/dressage-gpu-site or the folder it is given (no
#   network, no build);
# - env.sh: PYTHONPATH (that folder, then the repository), SLIME_ROOT and MEGATRON_LM_ROOT.
#
# --scipy adds SciPy 1.14 (41 MB), built for numpy 1.x, for a machine whose SciPy needs numpy 2:
# transformers imports scikit-learn, and so SciPy, when they are installed (the GPU image used
# here has both), and the carried numpy 1.x breaks that SciPy.
#
# sglang, ray and wandb do not travel: the GPU tier stands in for them (tests/real_slime/
# standins.py says why, one line each).
set -euo pipefail

usage() {
  echo "usage: SLIME_ROOT=... MEGATRON_LM_ROOT=... $0 OUT_DIR [--python 3.12] [--scipy]" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
out=$1
shift
python_version=3.12
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) python_version=${2:?--python needs a version such as 3.12}; shift 2 ;;
    --scipy) extra+=(scipy==1.14.1); shift ;;
    *) usage ;;
  esac
done
for name in SLIME_ROOT MEGATRON_LM_ROOT; do
  if [[ -z ${!name:-} || ! -d ${!name} ]]; then
    echo "$name must name a folder (it is '${!name:-}'): the carry copies it" >&2
    exit 2
  fi
done
[[ -d $SLIME_ROOT/slime ]] || { echo "SLIME_ROOT=$SLIME_ROOT has no slime/ package" >&2; exit 2; }
[[ -d $MEGATRON_LM_ROOT/megatron/training ]] || {
  echo "MEGATRON_LM_ROOT=$MEGATRON_LM_ROOT has no megatron/training" >&2; exit 2; }

here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python  # pip, to download (make venv makes it); else the PATH's
[[ -x $python ]] || python=python3

# One version of each: two of one package stop the whole install there.
wheels=(
  megatron-core==0.16.1
  torch-memory-saver==0.0.10
  numpy==1.26.4
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  pydantic-settings==2.16.3
  python-dotenv==1.2.4
  orjson==3.13.0
  pytest==9.2.0
  pluggy==1.7.0
  iniconfig==2.3.1
  pygments==2.21.0
  pytest-timeout==2.4.0
)

rm -rf "$out"
mkdir -p "$out/wheels"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" \
  --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any \
  "${wheels[@]}" "${extra[@]}"
cp -r "$SLIME_ROOT" "$out/slime"
cp -r "$MEGATRON_LM_ROOT" "$out/megatron-lm"
find "$out" -name __pycache__ -type d -prune -exec rm -rf {} +

cat > "$out/install.sh" <<'SCRIPT'
#!/usr/bin/env bash
# bash install.sh [SITE]: the carried wheels into SITE (default /tmp/dressage-gpu-site), for
# this machine's python3, offline.
set -euo pipefail
carry=$(cd "$(dirname "$0")" && pwd)
site=${1:-/tmp/dressage-gpu-site}
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$carry"/wheels/*.whl
echo "installed $(ls "$carry"/wheels | wc -l) wheels into $site"
SCRIPT
cat > "$out/env.sh" <<'SCRIPT'
# . env.sh [SITE], from the repository's root after install.sh: the carried packages come
# before the machine's (numpy 1.x over its numpy 2), then the repository.
carry=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH=${1:-/tmp/dressage-gpu-site}:$PWD${PYTHONPATH:+:$PYTHONPATH}
export SLIME_ROOT=$carry/slime MEGATRON_LM_ROOT=$carry/megatron-lm
SCRIPT
chmod +x "$out/install.sh"
echo "$out: $(du -sh "$out" | cut -f1), $(ls "$out/wheels" | wc -l) wheels for Python $python_version"
