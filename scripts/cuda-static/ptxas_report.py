"""Registers, spills and occupancy of CUDA kernels, from their source, without a GPU.

Compiles each kernel listed in SOURCES/kernels.tsv (name, variant, threads, file) with NVRTC
to PTX for ARCH, runs `ptxas -v` on the PTX, and writes REPORT.md and REPORT.json: registers per
thread, spill stores and loads, stack frame, shared memory per cube (CubeCL's source states each
shared array's size) and the theoretical occupancy of an sm_90 multiprocessor. Exits 1 when a
kernel spills more than --max-spill-bytes. report.sh fetches NVRTC and ptxas and calls this.
"""

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

# An sm_90 (H100, H200) multiprocessor, from NVIDIA's CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability", and its occupancy calculator's allocation rules.
REGISTERS = 65536
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
MAX_WARPS = 64
MAX_CUBES = 32
SHARED_BYTES = 228 * 1024
SHARED_RESERVED = 1024  # per cube, taken by the system
SHARED_UNIT = 128


def ptx_of(nvrtc, source, arch, label):
    """PTX of `source`, or exits with NVRTC's log, naming the kernel by `label`."""
    program = ctypes.c_void_p()
    # CubeCL's runtime hands NVRTC the CUDA headers; NVRTC declares what these kernels use.
    source = source.replace("#include <cuda_runtime.h>", "")
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu",
                                          0, None, None))
    options = [f"--gpu-architecture={arch}".encode(), b"-lineinfo"]
    status = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    if status != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        sys.exit(f"error: NVRTC could not compile {label} (status {status}); CubeCL's "
                 f"CUDA runtime compiles with NVRTC too:\n{log.value.decode()}")
    size = ctypes.c_size_t()
    check(nvrtc, nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size)))
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(program, ptx))
    return ptx.value


def check(nvrtc, status):
    if status != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"error: NVRTC: {nvrtc.nvrtcGetErrorString(status).decode()}")


def ptxas_facts(ptxas, ptx, arch):
    """Registers, spill stores and loads, and stack frame bytes, as `ptxas -v` reports them."""
    with tempfile.NamedTemporaryFile(suffix=".ptx") as file:
        file.write(ptx)
        file.flush()
        result = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", file.name, "-o", os.devnull],
                                capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: ptxas failed:\n{result.stderr}")
    text = result.stderr
    registers = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if not registers or not spills:
        sys.exit(f"error: cannot read ptxas's report:\n{text}")
    stack, stores, loads = (int(value) for value in spills.groups())
    return int(registers.group(1)), stores, loads, stack


def shared_bytes(source):
    """The shared memory a cube declares: CubeCL writes `// Shared array size: N, B bytes`."""
    return sum(int(bytes_) for bytes_ in re.findall(r"Shared array size: \d+, (\d+) bytes", source))


def occupancy(threads, registers, shared):
    """Resident warps over the most an sm_90 multiprocessor holds, and what limits them."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    shared_per_cube = -(-(shared + SHARED_RESERVED) // SHARED_UNIT) * SHARED_UNIT
    limits = {
        "cubes": MAX_CUBES,
        "warps": MAX_WARPS // warps,
        "registers": (REGISTERS // per_warp) // warps,
        "shared memory": SHARED_BYTES // shared_per_cube,
    }
    cubes = min(limits.values())
    limit = min(limits, key=limits.get)
    return cubes * warps / MAX_WARPS, limit


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sources", required=True)
    parser.add_argument("--nvrtc", required=True, help="libnvrtc.so")
    parser.add_argument("--ptxas", required=True)
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--report", required=True, help="path without extension")
    parser.add_argument("--max-spill-bytes", type=int, default=None)
    args = parser.parse_args()
    nvrtc = ctypes.CDLL(args.nvrtc)
    listing = os.path.join(args.sources, "kernels.tsv")
    with open(listing) as file:
        rows = [line.rstrip("\n").split("\t") for line in file][1:]
    kernels = []
    for name, variant, threads, path in rows:
        with open(os.path.join(args.sources, path)) as file:
            source = file.read()
        label = f"{name} ({variant + ', ' if variant else ''}{path})"
        ptx = ptx_of(nvrtc, source, args.arch.replace("sm_", "compute_"), label)
        registers, stores, loads, stack = ptxas_facts(args.ptxas, ptx, args.arch)
        shared = shared_bytes(source)
        fraction, limit = occupancy(int(threads), registers, shared)
        kernels.append({"kernel": name, "variant": variant, "threads": int(threads),
                        "registers": registers, "spill_stores": stores, "spill_loads": loads,
                        "stack_bytes": stack, "shared_bytes": shared,
                        "occupancy": fraction, "occupancy_limit": limit})
    lines = [f"Compiled for {args.arch} by NVRTC, reported by `ptxas -v`; occupancy is the "
             "theoretical one of an sm_90 multiprocessor (resident warps of 64).", "",
             "| kernel | variant | threads | registers | spill stores / loads (bytes) | stack (bytes) "
             "| shared (bytes) | occupancy | limited by |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k in kernels:
        lines.append(f"| `{k['kernel']}` | {k['variant']} | {k['threads']} | {k['registers']} "
                     f"| {k['spill_stores']} / {k['spill_loads']} | {k['stack_bytes']} "
                     f"| {k['shared_bytes']} | {k['occupancy']:.0%} | {k['occupancy_limit']} |")
    write_atomically(args.report + ".md", "\n".join(lines) + "\n")
    write_atomically(args.report + ".json", json.dumps({"arch": args.arch, "kernels": kernels}, indent=2) + "\n")
    print("\n".join(lines))
    if args.max_spill_bytes is not None:
        over = [k for k in kernels if max(k["spill_stores"], k["spill_loads"]) > args.max_spill_bytes]
        for k in over:
            print(f"error: {k['kernel']} ({k['variant']}) spills {k['spill_stores']} bytes "
                  f"(stores) / {k['spill_loads']} (loads), over --max-spill-bytes "
                  f"{args.max_spill_bytes}", file=sys.stderr)
        if over:
            sys.exit(1)


def write_atomically(path, text):
    partial = path + ".partial"
    with open(partial, "w") as file:
        file.write(text)
    os.replace(partial, path)


if __name__ == "__main__":
    main()
