#!/usr/bin/env bash
# Every crate packaged, and its packaged source checked on its own: what `cargo package
# --workspace` verifies, without the third build of Burn its verification makes.
#
# `cargo package` verifies by building each packaged crate with its dependencies in a workspace of
# its own, where the workspace's profiles do not apply: unoptimised, so every dependency is built
# once more (445 s of a cold CI run). Here the crates are packaged without that build, unpacked
# side by side into a scratch workspace whose `[patch.crates-io]` points each `haares-*`
# dependency at its unpacked sibling, and `cargo check`ed with every target (library, binaries,
# examples, tests, benches) under the root's own profiles and lock file. A file the package leaves
# out (a module, an `include_str!`, an experiment) fails that check as it failed the verification
# build. The dependencies' check artifacts are the ones `cargo doc` and the GPU-feature checks
# left in the target directory, so only the haares crates are checked anew.
#
# Usage: bash scripts/ci/package-check.sh   (from anywhere; uses $CARGO_TARGET_DIR like cargo)
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
# haares-gpu-check is a tool of the repository (`publish = false`), not a package.
rm -f "$target"/package/haares-*.crate
cargo package --workspace --exclude haares-gpu-check --no-verify --quiet

version="$(cargo metadata --no-deps --format-version 1 \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["packages"][0]["version"])')"
scratch="$target/package-check"
rm -rf "$scratch"
mkdir -p "$scratch"
members=()
for crate in "$target"/package/haares-*-"$version".crate; do
    # --touch: the unpacked files are newer than any earlier check of them, so cargo checks them
    # anew even though the scratch path, and so the package's identity, is the same every run.
    tar -xzf "$crate" -C "$scratch" --touch
    members+=("$(basename "$crate" .crate)")
done
if [ "${#members[@]}" -ne 5 ]; then
    echo "error: expected 5 packaged crates at version $version, found ${#members[@]}: ${members[*]}" >&2
    exit 1
fi
{
    echo '[workspace]'
    echo 'resolver = "3"'
    printf 'members = [%s]\n' "$(printf '"%s", ' "${members[@]}" | sed 's/, $//')"
    echo
    echo '[patch.crates-io]'
    for member in "${members[@]}"; do
        echo "${member%-"$version"} = { path = \"$member\" }"
    done
    echo
    # The root's profiles, so that the dependencies' artifacts are the ones already built.
    sed -n '/^\[profile\./,$p' Cargo.toml
} > "$scratch/Cargo.toml"
cp Cargo.lock "$scratch/Cargo.lock"
# Not `--locked`: the packaged manifests lack the dev-dependencies on themselves (decision 27), so
# cargo drops those edges from the lock file. Every package must keep the version it was tested at.
cargo check --manifest-path "$scratch/Cargo.toml" --workspace --all-targets
python3 - Cargo.lock "$scratch/Cargo.lock" <<'PY'
import sys, tomllib
def versions(path):
    with open(path, "rb") as f:
        return {(p["name"], p["version"], p.get("source", "")) for p in tomllib.load(f)["package"]}
# The repository's tool crates are in the workspace's lock file and in no package.
tools = {("haares-gpu-check",)}
tested = {p for p in versions(sys.argv[1]) if p[:1] not in tools}
packaged = versions(sys.argv[2])
if tested != packaged:
    print("error: the packaged crates resolved to other versions than the workspace's lock file:",
          sorted(packaged ^ tested), sep="\n  ", file=sys.stderr)
    sys.exit(1)
PY
echo "package check: ${members[*]} packaged and checked from their packaged sources"
