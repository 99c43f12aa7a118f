#!/usr/bin/env python3
"""Alternates `haares-bench cost` runs of two builds and compares their steady step times.

`paired` alternates two methods inside one process; two *builds* (before and after a change)
cannot share a process, so this alternates whole runs instead, swapping the order every round
(A B, B A, ...) so that a machine drifting slower or faster biases neither. Per method it reports
the ratio of the pooled steady-step medians (B / A) with a 95% bootstrap interval over rounds,
every round's own ratio, whether the two builds' first and last losses are bitwise equal (a
change that should not alter behaviour must leave them so), and each build's peak allocated
memory over its runs.

    python3 scripts/bench/compare-builds.py OLD_BENCH NEW_BENCH --rounds 10 --out DIR \\
        -- --backend flex --preset cpu --methods standard,block-attnres,haares --no-launches

`--analyse-only` rereads DIR's JSON without running anything. docs/benchmarks.md, "Comparing two
builds", gives a run of it.
"""

import argparse
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys


def run_rounds(args, cost_args):
    os.makedirs(args.out, exist_ok=True)
    builds = [("a", args.build_a), ("b", args.build_b)]
    for r in range(1, args.rounds + 1):
        for label, binary in builds if r % 2 else builds[::-1]:
            stem = os.path.join(args.out, f"{label}-{r}")
            with open(stem + ".log", "w") as log:
                status = subprocess.call(
                    [binary, "cost", *cost_args, "--out", stem], stdout=log, stderr=log
                )
            if status != 0:
                sys.exit(f"error: {binary} cost exited with {status} in round {r}; see {stem}.log")
            print(f"round {r}: {label} done", flush=True)


def load(out):
    steps, losses, peaks = {}, {}, {}
    for path in sorted(glob.glob(os.path.join(out, "*-*.json"))):
        match = re.fullmatch(r"([ab])-(\d+)\.json", os.path.basename(path))
        if not match:
            continue
        label, r = match.group(1), int(match.group(2))
        with open(path) as f:
            report = json.load(f)
        warmup = report["spec"]["warmup"]
        for family, samples in report["samples"]:
            for sample in samples:
                key = (family, sample["method"])
                rounds = steps.setdefault(key, {}).setdefault(label, {})
                rounds.setdefault(r, []).extend(sample["step_s"][warmup:])
                losses.setdefault(key, {}).setdefault(label, set()).add(
                    (sample["first_loss"], sample["last_loss"])
                )
                if sample.get("peak_allocated_bytes") is not None:
                    peaks.setdefault(key, {}).setdefault(label, []).append(
                        sample["peak_allocated_bytes"]
                    )
    return steps, losses, peaks


def pooled_ratio(a, b, rounds):
    pool = lambda build: [s for r in rounds for s in build[r]]
    return statistics.median(pool(b)) / statistics.median(pool(a))


def peak_mb(peaks, key, label):
    values = peaks.get(key, {}).get(label)
    if not values:
        return "–"
    low, high = min(values) / 1e6, max(values) / 1e6
    return f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}–{high:.1f}"


def report(steps, losses, peaks, resamples=4000):
    rng = random.Random(1)
    print("| family | method | rounds | steady step A (s) | steady step B (s) | B / A | 95% interval | per round | losses | peak allocated A / B (MB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(steps):
        a, b = steps[key].get("a", {}), steps[key].get("b", {})
        rounds = sorted(set(a) & set(b))
        if not rounds:
            continue
        boots = sorted(
            pooled_ratio(a, b, [rng.choice(rounds) for _ in rounds]) for _ in range(resamples)
        )
        low, high = boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1]
        per_round = " ".join(
            f"{statistics.median(b[r]) / statistics.median(a[r]):.3f}" for r in rounds
        )
        same = losses[key].get("a") == losses[key].get("b")
        median = lambda build: statistics.median(s for r in rounds for s in build[r])
        print(
            f"| {key[0]} | {key[1]} | {len(rounds)} | {median(a):.4f} | {median(b):.4f} | "
            f"{pooled_ratio(a, b, rounds):.3f} | {low:.3f}–{high:.3f} | {per_round} | "
            f"{'equal' if same else 'DIFFER'} | "
            f"{peak_mb(peaks, key, 'a')} / {peak_mb(peaks, key, 'b')} |"
        )


def main():
    argv = sys.argv[1:]
    cost_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cost_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_a", help="the baseline build's haares-bench binary (A)")
    parser.add_argument("build_b", help="the changed build's haares-bench binary (B)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", required=True, help="folder for every run's report and log")
    parser.add_argument("--analyse-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.analyse_only:
        for binary in (args.build_a, args.build_b):
            if not os.access(binary, os.X_OK):
                sys.exit(f"error: {binary} is not an executable haares-bench binary")
        run_rounds(args, cost_args)
    steps, losses, peaks = load(args.out)
    if not steps:
        sys.exit(f"error: no a-N.json / b-N.json reports in {args.out}")
    report(steps, losses, peaks)


if __name__ == "__main__":
    main()
