#!/bin/sh
# Starts NVIDIA's MPS control daemon on this node (or container) when it has NVIDIA GPUs, so that the
# processes of the split pools that share one GPU (four actors at 0.25 GPU each, one per pool) run their
# kernels side by side instead of time-slicing the GPU. Run it before `ray start` (the recipes in deploy/
# do); the Ray workers started after it find the daemon through CUDA_MPS_PIPE_DIRECTORY (the images set
# it). Idempotent. Does nothing without an NVIDIA GPU, without the driver's nvidia-cuda-mps-control (the
# NVIDIA container runtime mounts it with the `compute` capability), or with ADJCAP_MPS=0.
# AMD GPUs have no MPS: there the split pools time-slice (or use fused actors, ray.pools=fused).
set -u
if [ "${ADJCAP_MPS:-1}" = "0" ]; then echo "MPS: off (ADJCAP_MPS=0)"; exit 0; fi
if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then echo "MPS: not started (no nvidia-cuda-mps-control here)"; exit 0; fi
if ! nvidia-smi -L >/dev/null 2>&1; then echo "MPS: not started (no NVIDIA GPU visible)"; exit 0; fi
export CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
export CUDA_MPS_LOG_DIRECTORY="${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-log}"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
# the defaults lie in the shared /tmp: a folder someone else planted there (or a link) would hold the daemon's
# control pipe and its logs; such a folder is refused (MPS off, Ray still starts), never written into
for d in "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"; do
  if [ -L "$d" ] || { [ ! -O "$d" ] && [ "$(stat -c %u "$d")" != 0 ]; }; then
    echo "MPS: not started ($d is a link or another user's folder; point CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY at folders of yours)"
    exit 0
  fi
done
if echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then echo "MPS: already on"; exit 0; fi
nvidia-cuda-mps-control -d && echo "MPS: on (pipe directory $CUDA_MPS_PIPE_DIRECTORY)"
