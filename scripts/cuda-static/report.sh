#!/usr/bin/env bash
# Whether every kernel the project launches compiles for CUDA, and its registers, spills, shared
# memory and occupancy, on a machine without a GPU (docs/benchmarks.md, "Kernels compiled for
# CUDA without a GPU").
#
#   bash scripts/cuda-static/report.sh OUT [HEAD_DIMS]      # HEAD_DIMS default 16,32,64,128
#
# 1. Writes the kernels' CUDA C++, as CubeCL generates it, to OUT/sources: the fused attention's
#    at each of HEAD_DIMS, every other kernel at the variants its launch sites use (the trainer's
#    example `kernel_cuda_sources`; it needs a Vulkan driver such as Mesa's lavapipe).
# 2. Compiles each with NVRTC and runs `ptxas -v` for sm_90a (H100, H200), and writes
#    OUT/report.md and OUT/report.json. Exits 1 when a kernel does not compile.
# NVRTC and ptxas come from NVIDIA's PyPI wheels (pinned below), fetched once with pip into
# HAARES_CUDA_TOOLS (default ~/.cache/haares/cuda-tools). Exits 1 when a kernel spills more than
# HAARES_MAX_SPILL_BYTES (default 32: ptxas keeps a few bytes of scratch in some kernels; a
# thread per position with whole rows in registers spilled 72 to 3,264).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: bash scripts/cuda-static/report.sh OUT [HEAD_DIMS]}"
head_dims="${2:-16,32,64,128}"
tools="${HAARES_CUDA_TOOLS:-${HOME:-/tmp}/.cache/haares/cuda-tools}"
cuda_version=12.9.86
nvrtc="$tools/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
ptxas="$tools/nvidia/cuda_nvcc/bin/ptxas"

if [ ! -f "$nvrtc" ] || [ ! -x "$ptxas" ]; then
    echo "fetching NVRTC and ptxas $cuda_version (NVIDIA's PyPI wheels, about 130 MB) into $tools" >&2
    staging="$(mktemp -d)"
    trap 'rm -rf "$staging"' EXIT
    if ! python3 -m pip download --quiet --no-deps --dest "$staging" \
        "nvidia-cuda-nvrtc-cu12==$cuda_version" "nvidia-cuda-nvcc-cu12==$cuda_version"; then
        echo "error: pip could not fetch the wheels: this needs PyPI, or set HAARES_CUDA_TOOLS to a folder that has nvidia/cuda_nvrtc/lib/libnvrtc.so.12 and nvidia/cuda_nvcc/bin/ptxas" >&2
        exit 1
    fi
    for wheel in "$staging"/*.whl; do
        python3 -m zipfile -e "$wheel" "$staging/unpacked"
    done
    chmod +x "$staging/unpacked/nvidia/cuda_nvcc/bin/"*
    mkdir -p "$tools"
    rm -rf "$tools/nvidia"
    mv "$staging/unpacked/nvidia" "$tools/nvidia"
fi

cd "$root"
XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" cargo run --quiet -p haares-train --features cuda,wgpu \
    --example kernel_cuda_sources -- "$out/sources" "$head_dims"
python3 "$root/scripts/cuda-static/ptxas_report.py" --sources "$out/sources" --nvrtc "$nvrtc" \
    --ptxas "$ptxas" --arch sm_90a --report "$out/report" \
    --max-spill-bytes "${HAARES_MAX_SPILL_BYTES:-32}"
