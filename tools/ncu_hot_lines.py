"""The hottest source lines of an ncu source page exported as CSV (`ncu --import R --page source --csv`,
tools/gpu_check.sh's ncusrc stage): per line its share of the kernel's executed warp instructions.

    python tools/ncu_hot_lines.py ncu_fwd_kernel_tc_seed_source.csv [--top 25]
"""
import argparse
import csv


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with open(args.csv, errors="replace", newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if any("Instructions Executed" in c for c in r)), None)
    if head is None:
        print(f"{args.csv}: no 'Instructions Executed' column; its first rows: {rows[:3]}")
        return
    column = next(i for i, c in enumerate(rows[head]) if "Instructions Executed" in c)
    body = [r for r in rows[head + 1:] if len(r) > column]
    total = sum(number(r[column]) for r in body) or 1.0
    print(f"{args.csv}: {len(body)} lines, {total:.3e} warp instructions executed; the {args.top} hottest:")
    for r in sorted(body, key=lambda r: -number(r[column]))[: args.top]:
        print(f"{number(r[column]) / total:6.1%}  " + " | ".join(c.strip()[:100] for c in r[:2]))


if __name__ == "__main__":
    main()
