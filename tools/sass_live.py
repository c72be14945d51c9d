#!/usr/bin/env python3
"""Which values hold a kernel's registers (docs/cuda.md, "Where a sweep's registers go").

Reads two listings of one cubin (built with -lineinfo): `nvdisasm -plr` (the registers live at each instruction:
one column per GPR) and `nvdisasm -gi` (each instruction's source inline chain), and takes one kernel (a
substring of its mangled name). Three views:

  --bars               the GPRs live at each block barrier (BAR.SYNC): a sweep's tile boundary, where only what the
                       sweep carries from tile to tile and what the kernel holds across it are live
  --at ADDR --since LO the GPRs live at ADDR (hex), each traced back to its last assignment before ADDR: "loop" when
                       that lies in [LO, ADDR] (LO: the sweep loop's first barrier: a value of the loop), else "held"
                       (set before the loop and kept through it); counted by the assignment's source chain
  --through FILE:LINE  how many GPRs are live at the instructions whose inline chain passes FILE:LINE (a sweep's
                       call site), as a histogram, and the innermost lines of the instructions at >= --high live

The trace walks the listing in address order, not the control flow graph (an assignment on a branch the path to
ADDR does not take can claim a register), and passes over calls (a CALL marks every register it may clobber).
Good enough to say what kind of value holds a register; read the SASS around ADDR before acting on one entry.

  nvdisasm -plr x.cubin > x.plr; nvdisasm -gi x.cubin > x.sass
  python tools/sass_live.py x.plr x.sass fwd_kernel_tcI13__nv_bfloat16 --bars
  python tools/sass_live.py x.plr x.sass fwd_kernel_tcI13__nv_bfloat16 --at 051d50 --since 04a5e0
"""
import argparse
import collections
import os
import re
import sys

from nvdisasm_listing import opcode, read_listing

ROW_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s")
HEADER_RE = re.compile(r"#\s+0 1 2 3 ")


def read_live(path, kernel):
    """{address: set of live GPR numbers} of the kernel's own section (not its out-of-line callees: '$' in the
    name) in an `nvdisasm -plr` listing. The marker of register r stands under the last digit of r in the header
    line that precedes the section; ':' live, 'v' read, '^' written, 'x' read and written."""
    rows, cols, cur, written = {}, None, None, {}
    with open(path) as f:
        for line in f:
            if HEADER_RE.search(line):
                base = line.index("#")
                gprs = line[base:line.index("|", base)]  # the GPR columns; PRED, UGPR and UPRED follow
                cols = {int(m.group()): base + m.end() - 1 for m in re.finditer(r"\d+", gprs)}
                continue
            if line.startswith(".text."):
                if rows:  # the kernel's section has ended: the rest of a large listing is other kernels'
                    break
                cur = line.strip()[6:].rstrip(":")
                continue
            if cur is None or kernel not in cur or "$" in cur or cols is None:
                continue
            m = ROW_RE.match(line)
            if not m or "// |" not in line:
                continue
            at = int(m.group(1), 16)
            marks = {r: line[p] for r, p in cols.items() if p < len(line)}
            rows[at] = {r for r, c in marks.items() if c in ":v^x"}
            written[at] = {r for r, c in marks.items() if c in "^x"}
    return rows, written


def short(chain, depth):
    return " < ".join("%s:%d" % (os.path.basename(f), n) for f, n in chain[:depth]) or "?"


def trace(ins, live, written, at, lo, depth=3):
    """Counter {(kind, chain): GPRs} of the GPRs live at address `at`: each traced to its last assignment before
    `at` in address order (calls passed over); kind "loop" when that assignment lies in [lo, at], else "held"."""
    text = {x.address: x.text for x in ins}
    chain = {x.address: x.chain for x in ins}
    before = sorted((a for a in written if a <= at), reverse=True)
    why = collections.Counter()
    for r in sorted(live[at]):
        src = next((a for a in before if r in written[a] and opcode(text.get(a, "")) != "CALL"), None)
        kind = "loop" if src is not None and src >= lo else "held"
        why[(kind, short(chain.get(src, ()), depth))] += 1
    return why


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plr", help="nvdisasm -plr listing")
    ap.add_argument("gi", help="nvdisasm -gi listing of the same cubin")
    ap.add_argument("kernel", help="a substring of the kernel's mangled name")
    ap.add_argument("--bars", action="store_true")
    ap.add_argument("--at", help="address (hex) of the instruction whose live GPRs to trace")
    ap.add_argument("--since", help="address (hex) where the loop around --at starts")
    ap.add_argument("--through", action="append", default=[], help="FILE:LINE of a call site (repeatable)")
    ap.add_argument("--high", type=int, default=230, help="--through: the live count worth listing lines at")
    ap.add_argument("--depth", type=int, default=3, help="frames of each chain printed")
    args = ap.parse_args()

    funcs = read_listing(args.gi)
    own = [v for k, v in funcs.items() if args.kernel in k and "$" not in k]
    if not own:
        sys.exit("no function matching %r in %s" % (args.kernel, args.gi))
    ins = max(own, key=len)
    live, written = read_live(args.plr, args.kernel)
    if not live:
        sys.exit("no live-register columns for %r in %s" % (args.kernel, args.plr))
    print("%s: %d instructions, at most %d GPRs live" % (args.kernel, len(ins), max(len(v) for v in live.values())))

    if args.bars:
        for x in ins:
            if opcode(x.text) == "BAR" and ".SYNC" in x.text and x.address in live:
                print("%06x %4d live  %s" % (x.address, len(live[x.address]), short(x.chain, 4)))

    if args.at:
        at, lo = int(args.at, 16), int(args.since or args.at, 16)
        why = trace(ins, live, written, at, lo, args.depth)
        held = sum(v for (k, _), v in why.items() if k == "held")
        print("%d GPRs live at %06x: %d held through the loop, %d set inside it" %
              (sum(why.values()), at, held, sum(why.values()) - held))
        for (kind, where), v in sorted(why.items(), key=lambda kv: (kv[0][0], -kv[1])):
            print("  %3d  %s  %s" % (v, kind, where))

    for site in args.through:
        hist, top, n, mx = collections.Counter(), collections.Counter(), 0, 0
        for x in ins:
            frames = ["%s:%d" % (os.path.basename(f), l) for f, l in x.chain]
            if site not in frames or x.address not in live:
                continue
            c = len(live[x.address])
            n, mx = n + 1, max(mx, c)
            hist[c // 16 * 16] += 1
            if c >= args.high:
                top[frames[0]] += 1
        print("through %s: %d instructions, at most %d live; by live GPRs (bins of 16): %s" %
              (site, n, mx, " ".join("%d:%d" % (k, hist[k]) for k in sorted(hist))))
        if top:
            print("  innermost lines at >= %d live: %s" % (args.high, ", ".join("%s %d" % kv for kv in top.most_common(10))))


if __name__ == "__main__":
    main()
