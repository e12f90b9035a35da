# The trainer image: slime's image plus dressage, the environment of the Ray job on a cluster
# (Megatron trains, SGLang generates, the recording proxy runs beside them).
#
#   docker build -f containers/trainer.Dockerfile -t dressage-trainer .
#
# The base is pinned to the slime release the reference names (docker/version.txt
# nightly-dev-20260810a, CUDA 12.9). torch, SGLang, Megatron and numpy come from that image and
# are never replaced: dressage's other dependencies are installed by name, constrained to the
# versions the image already has, and dressage itself with --no-deps.
ARG SLIME_IMAGE=slimerl/slime:nightly-dev-20260810a-cu129
FROM ${SLIME_IMAGE}

WORKDIR /opt/dressage
COPY pyproject.toml README.md ./
COPY containers/requirements_from_pyproject.py containers/
RUN pip freeze --exclude-editable > /tmp/slime-constraints.txt \
    && python containers/requirements_from_pyproject.py --names-only \
        --exclude torch transformers tokenizers safetensors numpy \
        > /tmp/dressage-requirements.txt \
    && pip install --no-cache-dir -c /tmp/slime-constraints.txt -r /tmp/dressage-requirements.txt

COPY dressage ./dressage
COPY configs ./configs
RUN pip install --no-cache-dir --no-deps -e . \
    && python -c "import dressage.launch.slime_command"
