# The image that cluster.yaml and jobs/k8s/rayjob-finetune.yaml refer to: Ray 2.60 on Python 3.11, a CUDA build of
# PyTorch, and this package. Build from the repository root:  docker build -t YOUR-REGISTRY/kermt-ray:latest .
# TORCH_INDEX picks the CUDA build of torch (see pytorch.org for the index that matches your driver); it is
# installed before the package so pip does not replace it with another build.
FROM rayproject/ray:2.60.0-py311-gpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /app
COPY --chown=ray:users pyproject.toml README.md LICENSE NOTICE ./
COPY --chown=ray:users kermt ./kermt
COPY --chown=ray:users ray_app ./ray_app
COPY --chown=ray:users jobs ./jobs
COPY --chown=ray:users data ./data
RUN pip install --no-cache-dir -e .
# NCCL comes with the CUDA torch wheel; on nodes with several network interfaces set NCCL_SOCKET_IFNAME (GPU) or
# GLOO_SOCKET_IFNAME (CPU) to the interface the nodes share.
