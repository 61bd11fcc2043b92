#!/usr/bin/env python3
"""Compares CTX_BENCH_SPACE_ROWS files of bench_simulator --space plan by plan.

Usage: compare_space_rows.py BASE.tsv[,BASE2.tsv...] NEW.tsv[,NEW2.tsv...] [--tol 1e-9] [--classes]
Each row: CPU ms, step seconds, layer iterations extrapolated, plan. Several files for one side
(comma-separated: runs of one binary) take each plan's lowest CPU time, which removes most of a
shared machine's noise; their step times must agree. Prints the number of plans, the largest
relative step-time difference (and its plan), the plans over the tolerance, and the CPU time of
both sides (total, plans over 10 ms, max). --classes adds the summed CPU time and the plans over
10 ms per class of plans (CP kind, cp, tp, recompute), new / base, for the classes that carry time.
Exit status 1 when a plan is missing or a step time differs by more than the tolerance.
"""
import re
import sys


def read_one(path):
    rows = {}
    with open(path) as f:
        for line in f:
            ms, step, extrapolated, plan = line.rstrip("\n").split("\t")
            rows[plan] = (float(ms), float(step), int(extrapolated))
    return rows


def read(paths):
    """One side: the lowest CPU time per plan over its files (the step time of the first; the
    others' must be the same bit for bit: one binary)."""
    runs = [read_one(p) for p in paths.split(",")]
    rows = dict(runs[0])
    for other in runs[1:]:
        if set(other) != set(rows):
            sys.exit(f"{paths}: the files hold different plans")
        for plan, (ms, step, extrapolated) in other.items():
            if step != rows[plan][1]:
                sys.exit(f"{paths}: two runs of one side give {plan} different step times ({rows[plan][1]!r}, {step!r})")
            if ms < rows[plan][0]:
                rows[plan] = (ms, rows[plan][1], rows[plan][2])
    return rows


def plan_class(plan):
    def key(name, default):
        m = re.search(r"(?:^|,)" + name + r"=([^,]+)", plan)
        return m.group(1) if m else default
    return (key("cp_kind", "-"), int(key("cp", "1")), int(key("tp", "1")), key("recompute", "none"))


def main():
    args = sys.argv[1:]
    tol = 1e-9
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    classes = "--classes" in args
    if classes:
        args.remove("--classes")
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
    if classes:
        sums = {}
        for plan in set(base) & set(new):
            s = sums.setdefault(plan_class(plan), [0, 0.0, 0.0, 0, 0])
            s[0] += 1
            s[1] += base[plan][0]
            s[2] += new[plan][0]
            s[3] += base[plan][0] > 10
            s[4] += new[plan][0] > 10
        print("class (cp_kind, cp, tp, recompute): plans, CPU ms base -> new (new/base), plans over 10 ms base -> new")
        for c in sorted(sums):
            n, b, x, ob, on = sums[c]
            if b > 500 or ob or on:  # the classes that carry time
                print(f"  {c}: {n}, {b:.0f} -> {x:.0f} ({x / b:.2f}x), {ob} -> {on}")
    return 1 if missing or over else 0


if __name__ == "__main__":
    sys.exit(main())
