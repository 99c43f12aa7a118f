"""The PyTorch side of `haares-bench products`: `torch.matmul` at each product of a training step.

Reads the products as JSON on stdin (a list of {"name", "m", "k", "n", "lhs_transposed",
"rhs_transposed"}), makes each operand as haares-bench does (a transposed operand stored
transposed and handed over as a view), and times `repeats` products after two warm-up products
with CUDA events, once with TF32 allowed and once in f32. Answers one JSON line after the marker:
{"torch": version, "device": name, "timings": [{"name", "kernels": "TorchTf32" | "TorchFp32",
"device_s"}]}.

Usage: python torch_products.py --repeats N < products.json
"""

import argparse
import json
import sys

import torch

RESULT_PREFIX = "HAARES-PRODUCTS-RESULT "


def operand(rows, columns, transposed, generator):
    """A `rows × columns` operand in [-1, 1): stored transposed and viewed back when asked."""
    shape = (columns, rows) if transposed else (rows, columns)
    stored = torch.rand(shape, generator=generator, device="cuda") * 2 - 1
    return stored.t() if transposed else stored


def device_seconds(product, repeats):
    """Device seconds per product: CUDA events around `repeats` products, after two."""
    for _ in range(2):
        product()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        product()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_products.py: this PyTorch has no CUDA device")
    cases = json.load(sys.stdin)
    generator = torch.Generator(device="cuda").manual_seed(2026)
    timings = []
    for case in cases:
        lhs = operand(case["m"], case["k"], case["lhs_transposed"], generator)
        rhs = operand(case["k"], case["n"], case["rhs_transposed"], generator)
        for kernels, tf32 in (("TorchTf32", True), ("TorchFp32", False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            seconds = device_seconds(lambda: torch.matmul(lhs, rhs), args.repeats)
            timings.append({"name": case["name"], "kernels": kernels, "device_s": seconds})
        del lhs, rhs
    answer = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "timings": timings,
    }
    print(RESULT_PREFIX + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
