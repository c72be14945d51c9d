"""Where a kernel's instructions and stalls go, from an ncu source page exported with both views
(`ncu --import R --page source --csv --print-source cuda,sass`, tools/gpu_check.sh's ncusrc stage; gzip
allowed): per CUDA source line its share of the executed warp instructions and of the warp-stall samples,
the same per source file, and the executed instructions per SASS opcode.

    python tools/ncu_hot_lines.py ncu_fwd_kernel_tc_seed_source.csv.gz [--top 25]

The export holds one section per source file ("File Path", "Function Name", then a header row); a row
with a line number is the source line with its metrics summed over its SASS, the rows after it without
one are its SASS instructions (address, text, metrics).
"""
import argparse
import collections
import csv
import gzip
import re


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(sass: str) -> str:
    """'@!P0 HMMA.16816.F32.BF16 R0, ...' -> 'HMMA'"""
    words = [w for w in sass.split() if not w.startswith("@")]
    return re.split(r"[.\s]", words[0])[0] if words else "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt", errors="replace", newline="") as f:
        rows = list(csv.reader(f))
    lines, files, ops = [], collections.Counter(), collections.Counter()
    path, col = "?", None
    for r in rows:
        if len(r) >= 2 and r[0] == "File Path":
            path = r[1].split("/")[-1]
        elif "Instructions Executed" in r and "Line No" in r:
            col = {name: i for i, name in reversed(list(enumerate(r)))}  # the first column of each name
            inst, stall = col["Instructions Executed"], col.get("Warp Stall Sampling (All Samples)")
        elif col is not None and len(r) > inst:
            if r[0].strip():  # a source line: its SASS summed
                n, s = number(r[inst]), number(r[stall]) if stall is not None else 0.0
                if n or s:
                    lines.append((n, s, f"{path}:{r[0]}", r[1].strip()))
                    files[path] += n
            elif r[2].startswith("0x"):  # one SASS instruction
                ops[opcode(r[3])] += number(r[inst])
    if not lines:
        print(f"{args.csv}: no source lines with 'Instructions Executed' (export with --print-source cuda,sass)")
        return
    total = sum(n for n, _, _, _ in lines) or 1.0
    samples = sum(s for _, s, _, _ in lines) or 1.0
    print(f"{args.csv}: {total:.4e} warp instructions executed, {samples:.0f} stall samples, {len(lines)} lines")
    print("per source file (instructions):", ", ".join(f"{p} {n / total:.1%}" for p, n in files.most_common()))
    print("per SASS opcode (instructions):",
          ", ".join(f"{o} {n / total:.1%}" for o, n in ops.most_common(20)))
    for title, key in (("instructions", 0), ("stall samples", 1)):
        print(f"\nthe {args.top} hottest lines by {title} (instructions | stall samples | line | source):")
        for n, s, where, text in sorted(lines, key=lambda x: -x[key])[: args.top]:
            print(f"{n / total:6.1%} {s / samples:6.1%}  {where:<22} {text[:100]}")


if __name__ == "__main__":
    main()
