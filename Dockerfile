# syntax=docker/dockerfile:1
#
# Two images from one file (see README, "Install with Helm"):
#
#   docker build --target operator -t ghcr.io/npu-inference/npu-operator:0.1.0 .
#   docker build --target runtime  -t ghcr.io/npu-inference/npu-runtime:0.1.0 .
#   docker build --target runtime  -t ghcr.io/npu-inference/npu-runtime:0.1.0-a3 \
#       --build-arg VLLM_ASCEND_VARIANT=-a3 .
#
# operator: a slim Python image with the operator's dependencies only (the `operator` extra).
# runtime:  a vllm-ascend image (CANN, torch, torch_npu, vLLM, vllm-ascend) plus this package,
#           installed without touching the engine's packages; the base image's ENTRYPOINT, which
#           sources the CANN environment and then execs its arguments, is kept.
#
# tests/image/test_dockerfile.py checks this file (hadolint, the targets, the runtime keeping its
# ENTRYPOINT, the operator's dependency set); no Docker engine is available to build it in CI.

# The operator's base: the Python the project is tested with.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
# The runtime's base: quay.io/ascend/vllm-ascend:<version><variant>. The version is the image
# default of npu_runtime/engines.py RELEASES (vllm-ascend 0.23.0 with vLLM 0.23.0; the observer's
# hooks are checked against its source by tests/compat). The variants, as vllm-ascend's image
# workflow publishes them (npu_runtime/engines.py IMAGE_VARIANTS; tests/image checks this list):
#   variant            SoC    OS
#   ""                 A2     Ubuntu      (Atlas A2, 910B; the default)
#   "-openeuler"       A2     openEuler
#   "-a3"              A3     Ubuntu      (Atlas A3, 910C / 910_93)
#   "-a3-openeuler"    A3     openEuler
#   "-a5"              A5     Ubuntu      (Atlas 950)
#   "-a5-openeuler"    A5     openEuler
#   "-310p"            310P   Ubuntu      (Atlas 300I Duo / Pro)
#   "-310p-openeuler"  310P   openEuler
ARG VLLM_ASCEND_IMAGE=quay.io/ascend/vllm-ascend
ARG VLLM_ASCEND_VERSION=v0.23.0
ARG VLLM_ASCEND_VARIANT=""
ARG VERSION=0.1.0

# --- wheel: this project, built once for both images ---------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY crds ./crds
COPY operator ./operator
COPY runtime ./runtime
COPY sandbox ./sandbox
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- operator ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
ARG VERSION
LABEL org.opencontainers.image.title="npu-operator" \
      org.opencontainers.image.description="Kubernetes operator for NPUInference: vLLM on Huawei Ascend NPUs in FULL_DECODE_ONLY graph mode" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/npu-inference/npu-inference-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels /tmp/wheels
# Only the `operator` extra: kopf, aiohttp, jsonschema, prometheus-client (and PyYAML from the
# core). No torch, no vLLM; npu_runtime's pure modules come with the wheel and import without them.
RUN python -m pip install --no-cache-dir "$(ls /tmp/wheels/npu_inference-*.whl)[operator]" \
    && rm -rf /tmp/wheels \
    && groupadd --system --gid 65532 npu \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin npu
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["npu-operator"]
CMD ["run"]

# --- runtime -------------------------------------------------------------------------------------
FROM ${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}${VLLM_ASCEND_VARIANT} AS runtime
ARG VERSION
ARG VLLM_ASCEND_IMAGE
ARG VLLM_ASCEND_VERSION
ARG VLLM_ASCEND_VARIANT
# The vllm-ascend images configure a pip mirror; this package's few dependencies come from here.
ARG PIP_INDEX_URL=https://pypi.org/simple
LABEL org.opencontainers.image.title="npu-runtime" \
      org.opencontainers.image.description="npu-runtime: plans graph capture and serves vLLM on Ascend NPUs in FULL_DECODE_ONLY graph mode" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/npu-inference/npu-inference-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}${VLLM_ASCEND_VARIANT}"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel /wheels /tmp/wheels
# 1. The package itself with --no-deps: pip must not resolve (and "fix") torch, torch_npu or vLLM.
# 2. What the runtime needs beyond the core, only where the image lacks it (the `runtime` extra
#    and PyYAML; a requirement already satisfied is left alone).
# 3. Proof: the engine's packages are exactly what they were, and the plugin entry point is there.
# 4. `npu-runtime doctor --no-device`: the observer's hooks bind on this engine's source (AST; no
#    device, driver or CANN needed) and the plugin is registered; it exits non-zero when the
#    observer would be blind, so such an image is never pushed.
RUN python3 -m pip list --format=freeze \
        | grep -iE '^(torch|torch[-_]npu|vllm|vllm[-_]ascend|triton[-_]ascend)==' | sort > /tmp/engine-before.txt \
    && python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/npu_inference-*.whl \
    && python3 -m pip install --no-cache-dir --index-url "${PIP_INDEX_URL}" \
        "prometheus-client>=0.20" "aiohttp>=3.9" "pyyaml>=6" \
    && python3 -m pip list --format=freeze \
        | grep -iE '^(torch|torch[-_]npu|vllm|vllm[-_]ascend|triton[-_]ascend)==' | sort > /tmp/engine-after.txt \
    && diff /tmp/engine-before.txt /tmp/engine-after.txt \
    && python3 -c "import importlib.metadata as m; assert any(e.name == 'npu_graph_observer' for e in m.entry_points(group='vllm.general_plugins'))" \
    && python3 -c "import npu_runtime.cli" \
    && npu-runtime doctor --no-device \
    && rm -rf /tmp/wheels /tmp/engine-before.txt /tmp/engine-after.txt
# No ENTRYPOINT here: the base image's one sources the CANN environment, then runs the command.
# The operator's pods pass `npu-runtime serve ...` as args, never as command, for the same reason.
EXPOSE 8000 9090
CMD ["npu-runtime", "serve"]
