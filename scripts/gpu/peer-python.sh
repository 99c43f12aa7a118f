#!/usr/bin/env bash
# Puts the PyTorch peer's one import besides PyTorch, `safetensors` (crates/haares-bench/peer/
# torch_peer.py reads our weights with it), into BUNDLE/python: the GPU machine's Python has
# PyTorch but may lack safetensors, and it has no network to install it. run.sh adds the folder to
# PYTHONPATH only where that Python cannot import safetensors itself.
# The wheel is the abi3 build for CPython 3.8 and later on x86-64 Linux, unpacked (a wheel is a zip).
#
# Usage: bash scripts/gpu/peer-python.sh BUNDLE     (build.sh calls it on the bundle it builds)
set -euo pipefail
bundle="${1:?usage: bash scripts/gpu/peer-python.sh BUNDLE}"
version=0.5.3
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --implementation cp --abi abi3 --python-version 3.8 "safetensors==$version" -d "$wheels"
rm -rf "$bundle/python"
mkdir -p "$bundle/python"
python3 -m zipfile -e "$wheels"/safetensors-"$version"-*.whl "$bundle/python"
echo "safetensors $version for the PyTorch peer: $bundle/python" >&2
