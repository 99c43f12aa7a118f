#!/usr/bin/env bash
# Runs the GPU check on a GPU node from the bundle that scripts/gpu/build.sh made; needs no
# Rust toolchain and no network. Every stage has its own time budget. After each stage OUT holds a
# few files, for nodes that hand back only a few: summary.md, results.tar.gz (the whole check
# folder: summary.json, logs, reports, JSON) and kernel-cache.tar.gz.0, .1, … (CubeCL's compiled and
# tuned kernels, for the bundle of the next run; parts of 15 MiB, at most 4, unless
# --part-mib/--max-parts say otherwise; scripts/gpu/README.md).
#
# Usage: bash scripts/gpu/run.sh OUT [STAGES] [more haares-gpu-check options]
#   OUT      output folder (on the device tool: "$OUT")
#   STAGES   comma-separated subset of facts,portability,products,cost-small,cost-medium,
#            compile-small,kernel-times,first-step,first-step-deep,real-run,placement (default:
#            all; the gpu profile's budgets add up to 1,800 s, so use several calls:
#            scripts/gpu/README.md)
# Environment: HAARES_GPU_BUNDLE (default .gpu), HAARES_GPU_BACKEND (default cuda),
#              HAARES_KERNEL_CACHE (CubeCL's compiled-kernel and autotune caches; default
#              ~/.cache/haares/kernels, seeded from the bundle's kernel-cache.tar.gz if it has one),
#              HAARES_GPU_TUNED=1 (the check and its GEMM, first-step and cost workers run the
#              bundle's haares-bench-tuned, built with CubeCL autotuning; the default bench and the
#              real run's haares-train are built without it), HAARES_PRODUCTS (the matrix
#              products' provider, default cublas here: docs/decisions.md, decision 36).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: bash scripts/gpu/run.sh OUT [STAGES] [options]}"
shift
stages=()
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    stages=(--stages "$1")
    shift
fi
bundle="${HAARES_GPU_BUNDLE:-$root/.gpu}"
if [ ! -f "$bundle/manifest.json" ]; then
    echo "error: no bundle at $bundle: run scripts/gpu/build.sh on a machine with Rust first" >&2
    exit 2
fi
bundle="$(cd "$bundle" && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
for packed in "$bundle"/bin/*.gz; do
    name="$(basename "$packed" .gz)"
    gunzip -c "$packed" > "$bin/$name"
    chmod +x "$bin/$name"
done
echo "bundle commit $(grep -o '"commit": "[^"]*"' "$bundle/manifest.json" | cut -d'"' -f4)" >&2
export HAARES_KERNEL_CACHE="${HAARES_KERNEL_CACHE:-${HOME:-/tmp}/.cache/haares/kernels}"
if [ -f "$bundle/kernel-cache.tar.gz" ]; then
    mkdir -p "$HAARES_KERNEL_CACHE"
    tar -xzf "$bundle/kernel-cache.tar.gz" -C "$HAARES_KERNEL_CACHE"
    echo "kernel cache seeded from the bundle into $HAARES_KERNEL_CACHE" >&2
fi
# The PyTorch peer's safetensors from the bundle, only where this machine's Python has none.
if [ -d "$bundle/python" ] && ! python3 -c 'import safetensors' 2> /dev/null; then
    export PYTHONPATH="$bundle/python${PYTHONPATH:+:$PYTHONPATH}"
    echo "python3 has no safetensors: the PyTorch peer takes the bundle's" >&2
fi
# cuBLAS for the matrix products (decision 36): the loader's, the CUDA toolkit's, or PyTorch's own
# copy; its folder goes on the loader's path, since cudarc loads it by name at run time.
export HAARES_PRODUCTS="${HAARES_PRODUCTS:-cublas}"
find_cublas() {
    local candidate sp
    if ldconfig -p 2> /dev/null | grep 'libcublas\.so' > /dev/null; then
        echo "the loader's cache"
        return
    fi
    for candidate in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64 \
        /usr/local/cuda/targets/x86_64-linux/lib; do
        if ls "$candidate"/libcublas.so* > /dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
    for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2> /dev/null); do
        candidate="$(find "$sp/nvidia" "$sp/torch/lib" -name 'libcublas.so*' 2> /dev/null | head -n 1)"
        if [ -n "$candidate" ]; then
            dirname "$candidate"
            return
        fi
    done
}
cublas="$(find_cublas || true)"
case "$cublas" in
    "") echo "cuBLAS: no libcublas found (loader cache, CUDA toolkit, PyTorch's nvidia/ or" \
        "torch/lib); the products run on cubek and every stage says so" >&2 ;;
    "the loader's cache") echo "cuBLAS: in the loader's cache; products by $HAARES_PRODUCTS" >&2 ;;
    *) export LD_LIBRARY_PATH="$cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
       echo "cuBLAS: $(ls "$cublas"/libcublas.so* | head -n 1), put on LD_LIBRARY_PATH;" \
           "products by $HAARES_PRODUCTS" >&2 ;;
esac
# The check's own folder stays outside OUT; OUT gets the packed files after every stage.
raw="$(mktemp -d)/check"
mkdir -p "$raw"
cp "$bundle/manifest.json" "$raw/manifest.json"
bench="$bin/haares-bench"
if [ -n "${HAARES_GPU_UNTUNED:-}" ]; then
    echo "note: HAARES_GPU_UNTUNED is no longer read: the bundle's haares-bench and haares-train" \
        "are built without autotuning; HAARES_GPU_TUNED=1 runs the autotuned bench" >&2
fi
if [ "${HAARES_GPU_TUNED:-0}" = 1 ]; then
    bench="$bin/haares-bench-tuned"
    if [ ! -x "$bench" ]; then
        echo "error: HAARES_GPU_TUNED=1, but the bundle has no haares-bench-tuned: rebuild it" \
            "with scripts/gpu/build.sh" >&2
        exit 2
    fi
fi
echo "running $(basename "$bench")" >&2
# The portability test finds nothing relative to its working directory; the others write in the
# check's folder.
cd "$root"
"$bin/haares-gpu-check" --backend "${HAARES_GPU_BACKEND:-cuda}" --out "$raw" --pack "$out" \
    --bench-bin "$bench" --train-bin "$bin/haares-train" --portability-bin "$bin/portability" \
    --manifest "$bundle/manifest.json" "${stages[@]}" "$@"
