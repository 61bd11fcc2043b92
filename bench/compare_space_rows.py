#!/usr/bin/env python3
"""Compares two CTX_BENCH_SPACE_ROWS files of bench_simulator --space plan by plan.

Usage: compare_space_rows.py BASE.tsv NEW.tsv [--tol 1e-9]
Each row: CPU ms, step seconds, layer iterations extrapolated, plan. Prints the number of plans,
the largest relative step-time difference (and its plan), the plans over the tolerance, and the
CPU time of both (total, plans over 10 ms, max). Exit status 1 when a plan is missing or a step
time differs by more than the tolerance.
"""
import sys


def read(path):
    rows = {}
    with open(path) as f:
        for line in f:
            ms, step, extrapolated, plan = line.rstrip("\n").split("\t")
            rows[plan] = (float(ms), float(step), int(extrapolated))
    return rows


def main():
    args = sys.argv[1:]
    tol = 1e-9
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__)
        return 2
    base, new = read(args[0]), read(args[1])
    missing = sorted(set(base) ^ set(new))
    worst, worst_plan, over = 0.0, "", []
    for plan in sorted(set(base) & set(new)):
        b, n = base[plan][1], new[plan][1]
        d = abs(n - b) / max(abs(b), 1e-300) if n != b else 0.0
        if d > worst:
            worst, worst_plan = d, plan
        if d > tol:
            over.append((d, plan))
    print(f"{len(base)} plans in {args[0]}, {len(new)} in {args[1]}, {len(missing)} in one only")
    print(f"max relative step-time difference {worst:.3e}" + (f" ({worst_plan})" if worst_plan else ""))
    print(f"{len(over)} plans over {tol:g}")
    for d, plan in sorted(over, reverse=True)[:10]:
        print(f"  {d:.3e}  {plan}")
    for name, rows in (("base", base), ("new", new)):
        ms = [r[0] for r in rows.values()]
        print(f"{name}: CPU {sum(ms) / 1e3:.2f} s total, {sum(1 for x in ms if x > 10)} plans over 10 ms, max {max(ms):.1f} ms")
    return 1 if missing or over else 0


if __name__ == "__main__":
    sys.exit(main())
