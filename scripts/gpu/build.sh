#!/usr/bin/env bash
# Builds the GPU check's bundle here (no GPU needed; CUDA is loaded at run time):
#   .gpu/bin/haares-bench.gz, .gpu/bin/haares-train.gz  (without CubeCL autotuning: one kernel per
#                                                       matrix-product shape, so a cold first step
#                                                       takes seconds, not minutes)
#   .gpu/bin/haares-bench-tuned.gz  (haares-bench with autotuning, for run.sh's HAARES_GPU_TUNED=1)
#   .gpu/bin/haares-gpu-check.gz  (the stage runner, crates/haares-gpu-check)
#   .gpu/bin/portability.gz  (the core's portability test, with autotuning: the tuned build's
#                             matrix products are checked where CubeCL's kernels overrun,
#                             docs/decisions.md, decision 24)
#   all stripped and gzipped, and .gpu/manifest.json (commit, uncommitted changes, build date,
#   toolchain, feature, sizes, sha256).
# Send `.gpu` with the device tool's `carry` and run scripts/gpu/run.sh there
# (scripts/gpu/README.md).
#
# Usage: bash scripts/gpu/build.sh [cuda|wgpu]     (default cuda; output folder: $HAARES_GPU_BUNDLE or .gpu)
# HAARES_GPU_BUNDLE_MIB caps the bundle (default 64: what a device call of this project's GPU
# machines carries); 0 leaves it uncapped.
# With HAARES_GPU_SEED=DIR, the kernel cache an earlier run handed back (DIR/kernel-cache.tar.gz.0,
# .1, …) goes into the bundle as kernel-cache.tar.gz, and run.sh starts the stages from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
feature="${1:-cuda}"
case "$feature" in
    cuda | wgpu) ;;
    *) echo "error: the feature must be cuda or wgpu, not \`$feature\`" >&2; exit 2 ;;
esac
bundle="${HAARES_GPU_BUNDLE:-.gpu}"
cap_mib="${HAARES_GPU_BUNDLE_MIB:-64}"
case "$cap_mib" in
    '' | *[!0-9]*) echo "error: HAARES_GPU_BUNDLE_MIB must be a whole number of MiB, not \`$cap_mib\`" >&2; exit 2 ;;
esac
limit=$((cap_mib * 1024 * 1024))

# The executables' paths come from cargo's own messages, wherever the target directory is.
executables() {
    grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/'
}
# Refuses a binary built without a feature it needs, from the features cargo's message for it
# lists: `require_features MESSAGES haares-bench cuda autotune` checks the artifact whose
# executable is named haares-bench. Features are named bare (`--features cuda`), never as
# `<package>/cuda`: for a package with a dev-dependency on itself (decision 27), cargo reads that
# form as the dev-dependency's feature, which a plain `cargo build` leaves out, and builds without
# it.
require_features() {
    local messages="$1" name="$2" line feature
    shift 2
    line="$(grep '"reason":"compiler-artifact"' "$messages" | grep "\"executable\":\"[^\"]*/$name\"" || true)"
    if [ -z "$line" ]; then
        echo "error: cargo reported no \`$name\` executable" >&2
        exit 1
    fi
    for feature in "$@"; do
        if ! printf '%s' "$line" | grep -q "\"features\":\[[^]]*\"$feature\""; then
            echo "error: cargo built \`$name\` without its \`$feature\` feature, so the bundle" \
                "could not run the check; cargo's message for it: $line" >&2
            exit 1
        fi
    done
}
# The commit and whether the tree differs from it, read before cargo starts: what the build saw.
commit="$(git rev-parse HEAD)"
dirty="$(git status --porcelain --untracked-files=no | wc -l | tr -d ' ')"
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/bin"
# Strips and packs what one cargo command built, at once: another build into the same target
# directory (a `cargo test` without the feature) would overwrite the uplifted binaries later.
# PACK_SUFFIX names a variant (`-tuned`).
pack() {
    local exe name
    for exe in "$@"; do
        case "$(basename "$exe")" in
            haares-bench | haares-train | haares-gpu-check) name="$(basename "$exe")${PACK_SUFFIX:-}" ;;
            portability-*) name=portability ;;
            *) continue ;;
        esac
        strip -o "$staging/bin/$name" "$exe"
        gzip -9 -n -c "$staging/bin/$name" > "$staging/bin/$name.gz"
        rm "$staging/bin/$name"
    done
}
# Without the `autotune` feature (docs/benchmarks.md, "Build options for the GPU backends"): on a cold
# H200 its 48-layer first step took 13 s, the autotuned one compiled for more than 5 minutes.
echo "building haares-bench and haares-train with --features $feature, without autotuning ..." >&2
messages="$staging/cargo.json"
cargo build --message-format=json-render-diagnostics -p haares-bench -p haares-train \
    --no-default-features --features "ndarray,flex,$feature" > "$messages"
for name in haares-bench haares-train; do
    require_features "$messages" "$name" ndarray flex "$feature"
done
pack $(executables < "$messages")
# The stage runner; with CUDA it says whether cuBLAS loads. (`haares-gpu-check` has no wgpu
# feature: it launches nothing itself.)
check_features=""
[ "$feature" = cuda ] && check_features="--features cuda"
echo "building haares-gpu-check $check_features ..." >&2
cargo build --message-format=json-render-diagnostics -p haares-gpu-check $check_features > "$messages"
[ "$feature" = cuda ] && require_features "$messages" haares-gpu-check cuda
pack $(executables < "$messages")
echo "building the core's portability test with --features $feature,autotune ..." >&2
cargo test --no-run --message-format=json-render-diagnostics -p haares-core \
    --features "$feature,autotune" --test portability > "$messages"
pack $(executables < "$messages")
echo "building haares-bench with autotuning ..." >&2
cargo build --message-format=json-render-diagnostics -p haares-bench \
    --features "$feature,autotune" > "$messages"
require_features "$messages" haares-bench "$feature" autotune
PACK_SUFFIX=-tuned pack $(executables < "$messages")
rm "$messages"
for name in haares-bench haares-train portability haares-bench-tuned haares-gpu-check; do
    if [ ! -f "$staging/bin/$name.gz" ]; then
        echo "error: cargo built no \`$name\` executable" >&2
        exit 1
    fi
done

# The PyTorch peer's safetensors, for a GPU machine whose Python lacks it (peer-python.sh).
peer_python="null"
if bash scripts/gpu/peer-python.sh "$staging"; then
    peer_python='"safetensors 0.5.3 (python/)"'
else
    echo "warning: could not fetch safetensors for the PyTorch peer; the cost stage compares" \
        "with PyTorch only where the GPU machine's Python has safetensors" >&2
fi

seed="null"
if [ -n "${HAARES_GPU_SEED:-}" ]; then
    parts=()
    index=0
    while [ -f "$HAARES_GPU_SEED/kernel-cache.tar.gz.$index" ]; do
        parts+=("$HAARES_GPU_SEED/kernel-cache.tar.gz.$index")
        index=$((index + 1))
    done
    if [ ${#parts[@]} -eq 0 ]; then
        echo "error: HAARES_GPU_SEED=$HAARES_GPU_SEED holds no kernel-cache.tar.gz.0" >&2
        exit 2
    fi
    cat "${parts[@]}" > "$staging/kernel-cache.tar.gz"
    if ! tar -tzf "$staging/kernel-cache.tar.gz" > /dev/null; then
        echo "error: the kernel cache parts in $HAARES_GPU_SEED do not make a whole archive" >&2
        exit 2
    fi
    seed="{\"bytes\": $(stat -c %s "$staging/kernel-cache.tar.gz"), \"sha256\": \"$(sha256sum "$staging/kernel-cache.tar.gz" | cut -d' ' -f1)\"}"
fi

total=0
files=""
for f in "$staging"/bin/*.gz; do
    size=$(stat -c %s "$f")
    total=$((total + size))
    sum=$(sha256sum "$f" | cut -d' ' -f1)
    files="$files${files:+,}
    {\"file\": \"bin/$(basename "$f")\", \"bytes\": $size, \"sha256\": \"$sum\"}"
done
if [ -f "$staging/kernel-cache.tar.gz" ]; then
    total=$((total + $(stat -c %s "$staging/kernel-cache.tar.gz")))
fi
if [ -d "$staging/python" ]; then
    total=$((total + $(du -sb "$staging/python" | cut -f1)))
fi
if [ "$limit" -gt 0 ] && [ "$total" -gt "$limit" ]; then
    echo "error: the bundle is $total bytes, over the cap of $cap_mib MiB (HAARES_GPU_BUNDLE_MIB)" >&2
    exit 1
fi
cat > "$staging/manifest.json" <<JSON
{
  "commit": "$commit",
  "dirty": $([ "$dirty" = 0 ] && echo false || echo true),
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "rustc": "$(rustc --version)",
  "feature": "$feature",
  "autotune": {"haares-bench": false, "haares-train": false, "haares-bench-tuned": true, "portability": true},
  "total_bytes": $total,
  "kernel_cache_seed": $seed,
  "peer_python": $peer_python,
  "files": [$files
  ]
}
JSON
# Replace the bundle whole: a half-built one must never be carried.
rm -rf "$bundle.new"
mv "$staging" "$bundle.new"
trap - EXIT
rm -rf "$bundle"
mv "$bundle.new" "$bundle"
echo "bundle: $bundle ($total bytes, commit ${commit:0:10}$([ "$dirty" = 0 ] || echo ', with uncommitted changes'))"
