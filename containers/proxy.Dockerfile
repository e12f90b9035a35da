# The recording proxy (dressage-proxy) on its own, in front of an SGLang router or an engine.
#
#   docker build -f containers/proxy.Dockerfile -t dressage-proxy .
#   docker run --rm -p 127.0.0.1:8000:8000 -e DRESSAGE_PROXY_ADMIN_KEY \
#       -v "$PWD/runs/proxy-store:/data/proxy-store" dressage-proxy --engine-url http://sglang:30000
#
# It listens on 0.0.0.0 inside the container, so it refuses to start without an admin key
# (DRESSAGE_PROXY_ADMIN_KEY, passed from the environment, never baked in). No torch: the proxy
# only tokenizes.
FROM python:3.11-slim

WORKDIR /opt/dressage
COPY pyproject.toml README.md ./
COPY containers/requirements_from_pyproject.py containers/
RUN python containers/requirements_from_pyproject.py --exclude torch matplotlib \
        > /tmp/dressage-requirements.txt \
    && pip install --no-cache-dir -r /tmp/dressage-requirements.txt

COPY dressage ./dressage
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 10001 dressage \
    && mkdir -p /data/proxy-store && chown -R dressage /data

USER dressage
ENV DRESSAGE_PROXY_HOST=0.0.0.0 \
    DRESSAGE_PROXY_PORT=8000 \
    DRESSAGE_PROXY_STORE_DIR=/data/proxy-store \
    HF_HUB_OFFLINE=1
EXPOSE 8000
VOLUME ["/data/proxy-store"]
HEALTHCHECK CMD python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/health').status_code != 200)"
ENTRYPOINT ["dressage-proxy"]
