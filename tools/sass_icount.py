#!/usr/bin/env python3
"""sass_icount.py -- the warp instructions a GPU issues per kernel launch, estimated from the kernels'
static SASS and the emulator's execution counts (docs/cuda.md, "The cost model", "Issued instructions").

Inputs:
  --bbs FILE     the cost build's basic-block counts (`cuda_cost --bbs FILE`): per launch and size N, every
                 executed basic block of the host-compiled kernel code (its -fsanitize-coverage=trace-pc
                 call site) with its warp executions (per warp, its busiest lane's in each epoch between
                 two synchronizations of the warp, summed)
  --exe FILE     that cuda_cost executable (its code and DWARF line tables: objdump, addr2line)
  --sass FILE    `nvdisasm -gi` of the kernels' cubins (sm_90, -lineinfo): every SASS instruction with its
                 source line and inline chain (several files: one per cubin)

The scheme, with no per-kernel code:
 1. Host side: a basic block's code runs from its trace-pc call to the next one; every instruction of it
    has an inline chain (addr2line -i: the line, the line that called its inlined function, ...). A chain
    -- one source line in one inlined context -- executes as often as the most executed basic block that
    holds code of it. The cost build inlines everything and unrolls the ASC_UNROLL loops and the small
    constant-trip loops, as nvcc does, so that chains mean the same on both sides.
 2. Each chain's count is fitted as every other counter (the quadratic in N through the sizes, linear in
    B*H) to the target shape.
 3. SASS side: the kernel's basic blocks (labels and control-flow instructions end them); a SASS chain
    takes the count of the host chain of its innermost line that shares the most frames with it. A block
    with chains of its own executes as often as most of those say (chains inside a loop nvcc kept rolled,
    or under an if-converted condition, disagree; the straight-line rest agrees; a tie goes to the larger
    count); a block of shared chains only takes what the host counted less what the other blocks hold
    (block_counts); a block with no chain the host knows never ran.
 4. The anchor: the products' loops nvcc keeps (the row and column products' chunks, the score products' k16 steps
    at widths other than 32 and 64 features; until 2026-11-29 those steps were a loop at every width, which nvcc
    unrolled by 4 with a remainder) come out 3-11x too often from step 3. The emulator counts their mma and
    ldmatrix instructions exactly, per launch and per call site (the "exact" and "product" lines of --bbs), so
    the blocks holding HMMA or LDSM are scaled to each site's count (anchored(); "own*", "shared*", "site").
    The launch issues sum(block count x block instructions).

Output: per launch "icount VARIANT CALL INDEX WARP_INSTRUCTIONS SYMBOL HMMA LDSM RAW" at the target shape
(cuda_cost --icount reads them): the anchored total; HMMA, LDSM and RAW (the total) before the anchor, the first
two of which cuda_cost sets against the exact counts. With --detail N the N largest blocks of each launch. With
--ncu CSV.gz (ncu's per-SASS-instruction page of one kernel: address, source, "Instructions Executed") and --kernel SYMBOL it
compares in total, by how the blocks were counted, and (--detail N) the N largest differences per source
line and per block.
"""
import argparse
import bisect
import collections
import csv
import gzip
import os
import re
import subprocess
import sys

from nvdisasm_listing import opcode, read_listing

CONTROL = re.compile(r"^(@!?U?P\w+\s+)?(BRA|BRX|JMP|JMX|EXIT|RET|CALL|BSYNC|WARPSYNC|BPT|KILL)\b")


def frame(path, line):
    """A source location as (path below csrc/, line); None for code outside the project (the toolkit's and
    the emulator's headers, whose host and device code differ)."""
    return (path.split("csrc/", 1)[1], int(line)) if "csrc/" in path else None


def chain_key(frames):
    """An inline chain (innermost first) reduced to the project's frames, repeats merged."""
    out = []
    for f in frames:
        if f is not None and (not out or out[-1] != f):
            out.append(f)
    return tuple(out)


def read_bbs(path):
    """{(variant, call, index, symbol): {N: {site: warp executions}}}, {the same key: {N: (mma, ldmatrix)}} (the
    launch's exact counts, where the file has them), {the same key: {N: {(opcode, return address): warp
    executions}}} (per call site of an mma or ldmatrix), the B*H of the runs and the target (N, B*H) of the
    report."""
    runs = collections.defaultdict(dict)
    exact = collections.defaultdict(dict)
    products = collections.defaultdict(dict)
    heads, target = 1.0, (4096.0, 16.0)
    cur = key = size = None
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[0] == "target":
                target = (float(w[1]), float(w[2]))
            elif w[0] == "launch":
                cur, key, size = {}, (w[1], w[2], int(w[3]), w[6]), float(w[4])
                runs[key][size] = cur
                products[key][size] = {}
                heads = float(w[5])
            elif w[0] == "exact":
                exact[key][size] = (float(w[1]), float(w[2]))
            elif w[0] == "product":
                products[key][size][(w[1], int(w[2], 16))] = int(w[3])
            else:
                cur[int(w[0], 16)] = int(w[1])
    return runs, exact, products, heads, target


class HostCode:
    """The cost executable's code: the instructions of each trace-pc basic block and their inline chains."""

    def __init__(self, exe, dis=None):
        """dis: the executable's `objdump -d --no-show-raw-insn` (run here when not given)."""
        self.exe = exe
        self.insns, self.calls, self.funcs = [], [], []
        self.callees = collections.defaultdict(set)  # function start: the starts of the functions it calls
        if dis is None:
            dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", exe], capture_output=True, text=True,
                                 check=True).stdout
        # [ \t], not \s: an instruction without operands (ret) must not take the next lines, a function's name among them
        for m in re.finditer(r"^(?:[ \t]*([0-9a-f]+):\t(\S+)[ \t]*(.*)|([0-9a-f]+) <.*>:)$", dis, re.M):
            if m.group(4):
                self.funcs.append(int(m.group(4), 16))
                continue
            a = int(m.group(1), 16)
            self.insns.append(a)
            if m.group(2) == "call":
                if "<__sanitizer_cov_trace_pc>" in m.group(3):
                    self.calls.append(a + 5)  # its return address: the site the runtime records
                else:
                    t = re.match(r"([0-9a-f]+) <", m.group(3))
                    if t and self.funcs:
                        self.callees[self.funcs[-1]].add(int(t.group(1), 16))
        self.chains = {}

    def block(self, site):
        """The instruction addresses of the basic block whose trace-pc call returns to `site`."""
        nxt = bisect.bisect_right(self.calls, site)
        end = self.calls[nxt] - 5 if nxt < len(self.calls) else site + 1
        return self.insns[bisect.bisect_left(self.insns, site):bisect.bisect_left(self.insns, end)]

    def resolve(self, addrs):
        want = sorted(set(a for a in addrs if a not in self.chains))
        if not want:
            return
        out = subprocess.run(["addr2line", "-i", "-a", "-e", self.exe], input="\n".join("%x" % a for a in want),
                             capture_output=True, text=True, check=True).stdout
        cur, frames = None, []
        for line in out.split("\n") + ["0x0"]:
            if line.startswith("0x"):
                if cur is not None:
                    self.chains[cur] = chain_key(frames)
                cur, frames = int(line, 16), []
            elif line.strip():
                m = re.match(r"(.*):(\d+)", line.split(" (discriminator")[0])
                if m and m.group(2) != "0":
                    frames.append(frame(m.group(1), m.group(2)))

    def function_sites(self, sites):
        """Every basic block (trace-pc site) of the functions that hold these sites and of the functions they call,
        directly or not: an out-of-line function that never ran (drop_bits without dropout) then has its chains,
        at 0, and its SASS copy matches them instead of another line's chain of the same innermost frame (until
        2026-11-29 such blocks took other lines' counts: 5.2 % of the forward's estimate)."""
        todo = {self.funcs[bisect.bisect_right(self.funcs, s) - 1] for s in sites}
        seen, out = set(), set()
        while todo:
            lo = todo.pop()
            seen.add(lo)
            i = bisect.bisect_right(self.funcs, lo) - 1  # a call target inside a function: that function
            lo = self.funcs[i]
            hi = self.funcs[i + 1] if i + 1 < len(self.funcs) else 1 << 62
            out.update(self.calls[bisect.bisect_left(self.calls, lo):bisect.bisect_left(self.calls, hi)])
            todo |= self.callees.get(lo, set()) - seen
        return out

    def chain_counts(self, sites, static):
        """{chain: (executions, total)} of one run: each chain, the most executed basic block holding code of
        it, and the sum over its copies: the basic blocks holding as many instructions of it as the largest
        such block (the bodies of an unrolled loop each hold the whole line; the pieces of one line split
        across blocks rarely come in equal sizes); (0, 0) for the chains of the basic blocks in `static` that
        did not run."""
        sites = dict(sites)
        for s in static:
            sites.setdefault(s, 0)
        blocks = {s: self.block(s) for s in sites}
        self.resolve(a for b in blocks.values() for a in b)
        held = collections.defaultdict(list)  # chain: [(instructions of it in the block, executions)]
        for s, n in sites.items():
            for ch, k in collections.Counter(self.chains[a] for a in blocks[s]).items():
                if ch:
                    held[ch].append((k, n))
        out = {}
        for ch, hs in held.items():
            size = max(k for k, _ in hs)
            out[ch] = (max(n for _, n in hs), sum(n for k, n in hs if k == size))
        return out


MMA_HEADER = "cuda/mma.cuh"


def site_key(chain):
    """A product's call site: its inline chain without the frames in mma.cuh (whose device and emulator
    branches are different lines)."""
    return tuple(f for f in chain if f[0] != MMA_HEADER)


def read_sass(paths):
    """{function symbol: [(address, instruction, chain)] with None at each label} (a function in several
    cubins: the first listing's)."""
    funcs = {}
    for path in paths:
        for name, insns in read_listing(path).items():
            if name in funcs:
                continue
            code = funcs[name] = []
            for x in insns:
                if x.labels:
                    code.append(None)
                code.append((x.address, x.text, chain_key(frame(p, line) for p, line in x.chain)))
    return funcs


def sass_blocks(code):
    blocks, b = [], []
    for x in code:
        if x is None:
            if b:
                blocks.append(b)
            b = []
            continue
        b.append(x)
        if CONTROL.match(x[1]):
            blocks.append(b)
            b = []
    if b:
        blocks.append(b)
    return blocks


def lagrange(xs, ys, t):
    s = 0.0
    for i, y in enumerate(ys):
        w = y
        for j, x in enumerate(xs):
            if j != i:
                w *= (t - x) / (xs[i] - x)
        s += w
    return s


def at_target(by_size, target_n, target_bh, heads):
    """A count at the target shape from {N: count} of the runs at B*H = heads: the quadratic in N through
    the sizes (never below 0), linear in B*H."""
    sizes = sorted(by_size)
    return max(0.0, lagrange(sizes, [by_size[n] for n in sizes], target_n)) * target_bh / heads


def fitted_counts(host, runs, heads, target_n, target_bh):
    """{chain: executions at the target shape} from the runs at the small sizes."""
    sizes = sorted(runs)
    static = host.function_sites(set().union(*[set(r) for r in runs.values()]))
    per = {n: host.chain_counts(runs[n], static) for n in sizes}
    keys = set().union(*per.values())
    return {k: tuple(at_target({n: per[n].get(k, (0, 0))[i] for n in sizes}, target_n, target_bh, heads)
                     for i in (0, 1)) for k in keys}


def fitted_sites(host, products, target_n, target_bh, heads):
    """{(opcode, site key): executions at the target shape} of the products' call sites, from the runs'
    {N: {(opcode, return address): warp executions}} (the call instruction ends just before its return
    address: addr2line of the address before it); call sites outside the project's code are left out."""
    host.resolve(a - 1 for run in products.values() for _, a in run)
    per = {}
    for n, run in products.items():
        per[n] = collections.defaultdict(int)
        for (op, a), k in run.items():
            key = site_key(host.chains.get(a - 1, ()))
            if key:
                per[n][(op, key)] += k
    keys = set().union(*per.values())
    return {k: at_target({n: per[n].get(k, 0) for n in per}, target_n, target_bh, heads) for k in keys}


def matcher(counts):
    """The host counts (executions, total: chain_counts) of a SASS chain: the host chains of the same innermost
    line that share the most frames with it (nvcc and g++ describe inlined lambdas and some call sites
    differently, so chains rarely match whole); the largest count among equals. None where the host has no such
    line, or where an outer frame of the chain (a call site) is a line the host has in its chains but in no executed
    one: code under a call the launch never made. (nvcc may file one inlined copy's code under another copy's call
    site: in `fwd_kernel_tc` since 2026-11-30 the maps' sweep body, which the benchmark never runs, sits under F3's
    sweep call, and matched by its innermost lines alone it took F3's counts: +0.26e9 warp instructions. Frames the
    host does not have at all are nvcc's own descriptions and decide nothing.)"""
    by_line = collections.defaultdict(list)
    known, seen = set(), set()
    for ch, n in counts.items():
        by_line[ch[0]].append((set(ch), n))
        known.update(ch)
        if n[0] > 0:
            seen.update(ch)
    never = known - seen
    memo = {}

    def match(ch):
        if ch not in memo:
            best, n_best = -1, None
            frames = set(ch)
            if any(f in never for f in ch[1:]):
                memo[ch] = None
                return None
            for hs, n in by_line.get(ch[0] if ch else None, ()):
                score = len(frames & hs)
                if score > best or (score == best and n > n_best):
                    best, n_best = score, n
            memo[ch] = n_best
        return memo[ch]
    return match


def block_counts(blocks, counts, copies=False):
    """Per SASS block: (executions, how), from counts {chain: (executions, total)} (chain_counts). First the
    blocks with chains of their own ('own'): the count most of those chains agree on. Then the rest ('shared':
    copies nvcc made of the same code, a line split by a branch, the bodies of an unrolled loop): per chain,
    the host's executions less what the blocks already counted hold, split evenly between the remaining blocks
    holding it; again the count most chains agree on. A block none of whose chains the host has ('none') never
    ran. With `copies` the budget is the host's total over the chain's copies instead, none above its
    executions: the eight bodies of an unrolled loop that ptxas gave a block each then take one body's count
    each, not an eighth of it (docs/cuda.md, "B2c's staging and dz's column products": the default undercounts
    them; `copies` raised the seed estimate by 28 %, which no GPU has checked yet)."""
    match = matcher(counts)
    where = collections.defaultdict(set)
    for i, b in enumerate(blocks):
        for x in b:
            if x[2] and match(x[2]) is not None:
                where[x[2]].add(i)
    chains = [set(x[2] for x in b if x[2] in where) for b in blocks]
    out = [None] * len(blocks)

    def vote(values):
        votes = collections.Counter(round(v) for v in values)
        return float(max(votes.items(), key=lambda kv: (kv[1], kv[0]))[0])

    for i, cs in enumerate(chains):
        own = [c for c in cs if len(where[c]) == 1]
        if own:
            out[i] = (vote(match(c)[0] for c in own), "own")
        elif not cs:
            out[i] = (0.0, "none")
    for i, cs in enumerate(chains):
        if out[i] is None:
            rest = []
            for c in cs:
                most, total = match(c)
                done = sum(out[j][0] for j in where[c] if out[j] is not None and out[j][1] == "own")
                left = sum(1 for j in where[c] if out[j] is None or out[j][1] != "own")
                rest.append(min(most, max(0.0, (total if copies else most) - done) / left))
            out[i] = (vote(rest), "shared")
    return out


def ops_in(block, op):
    """How many instructions of one opcode a SASS block holds."""
    return sum(1 for x in block if opcode(x[1]) == op)


def issued(blocks, est, op):
    """The instructions of one opcode the blocks issue at their estimated counts."""
    return sum(n * ops_in(b, op) for (n, _), b in zip(est, blocks))


def site_matcher(sites):
    """The host call site of a SASS product instruction: (opcode, chain) -> a key of `sites` or None. The site
    with the same key, else the one with the same innermost frame outside mma.cuh that shares the most frames
    with it (nvcc and g++ describe some inlined lambdas differently: one side has a frame the other lacks),
    but never one whose frames differ from the instruction's by a line of the same file (another call site)."""
    by_first = collections.defaultdict(list)
    for op, key in sites:
        if key:
            by_first[(op, key[0])].append((op, key))
    memo = {}

    def match(op, chain):
        k = (op, site_key(chain))
        if k not in memo:
            pick = k if k in sites else None
            if pick is None and k[1]:
                best, mine = -1, set(k[1])
                for hk in by_first.get((op, k[1][0]), ()):
                    theirs = set(hk[1])
                    if {f for f, _ in mine - theirs} & {f for f, _ in theirs - mine}:
                        continue
                    if len(mine & theirs) > best:
                        best, pick = len(mine & theirs), hk
            memo[k] = pick
        return memo[k]
    return match


def anchored(blocks, est, exact, sites):
    """The block counts scaled so that the blocks holding HMMA and LDSM issue the exact mma and ldmatrix counts
    of each call site. The products' k16 loops are where the counts go wrong (nvcc unrolls them by 4 and keeps a
    remainder, g++ does not: the host count of their lines cannot say which copy ran), and every such block
    holds HMMA or LDSM. exact: {opcode: the launch's count} (the emulator's); sites: {(opcode, site key):
    count} (fitted_sites), each SASS instruction's site by site_matcher. A site scales its instructions by
    r = exact / estimated; where the estimate has none of a site's instructions run, the blocks of zero count
    holding them take the site's count spread evenly over its copies ("site"); the instructions of no site
    (and the sites of none) share one ratio of what is left. A block scales by the mean r of its HMMA and
    LDSM. Unchanged where an estimate has none of either."""
    match = site_matcher(sites)
    inst = []  # per block: the site (or the opcode, where none) of each HMMA / LDSM
    est_of, copies = collections.defaultdict(float), collections.defaultdict(int)
    for (n, _), b in zip(est, blocks):
        mine = []
        for x in b:
            op = opcode(x[1])
            if op in ("HMMA", "LDSM"):
                s_ = match(op, x[2]) or op
                mine.append(s_)
                est_of[s_] += n
                copies[s_] += 1
        inst.append(mine)
    ratio = {s_: sites[s_] / e for s_, e in est_of.items() if s_ in sites and e > 0}
    spread = {s_: sites[s_] / copies[s_] for s_, e in est_of.items() if s_ in sites and e == 0 and sites[s_] > 0}
    for op in ("HMMA", "LDSM"):
        left = exact.get(op, 0.0) - sum(sites[s_] for s_ in list(ratio) + list(spread) if s_[0] == op)
        if est_of.get(op, 0.0) > 0:
            ratio[op] = max(0.0, left) / est_of[op]
    out = []
    for (n, how), mine in zip(est, inst):
        if not mine:
            out.append((n, how))
        elif n == 0 and any(s_ in spread for s_ in mine):
            fill = [spread[s_] for s_ in mine if s_ in spread]
            out.append((sum(fill) / len(fill), "site"))
        else:
            out.append((n * sum(ratio.get(s_, 1.0) for s_ in mine) / len(mine), how + "*"))
    return out


def read_ncu(path):
    """{address offset: warp instructions executed} of ncu's per-SASS-instruction CSV."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Instructions Executed" in r)
    col = rows[head].index("Instructions Executed")
    body = [r for r in rows[head + 1:] if r and r[0].startswith("0x")]
    base = int(body[0][0], 16)
    return {int(r[0], 16) - base: int(r[col]) for r in body}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bbs", required=True)
    ap.add_argument("--exe", required=True)
    ap.add_argument("--sass", required=True, nargs="+")
    ap.add_argument("--variant", help="only this variant's launches")
    ap.add_argument("--kernel", help="only the launches of this (mangled) kernel")
    ap.add_argument("--ncu", help="ncu's per-SASS-instruction CSV of --kernel: compare")
    ap.add_argument("--detail", type=int, default=0, help="print the N largest blocks of each launch")
    ap.add_argument("--copies", action="store_true",
                    help="shared blocks take the host's total over a chain's copies (block_counts)")
    a = ap.parse_args()
    runs, exact, products, heads, (target_n, target_bh) = read_bbs(a.bbs)
    funcs = read_sass(a.sass)
    host = HostCode(a.exe)
    truth = read_ncu(a.ncu) if a.ncu else None
    for (variant, call, index, sym), r in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if (a.variant and variant != a.variant) or (a.kernel and sym != a.kernel):
            continue
        # nvcc leaves out the internal-linkage marker of a static kernel's name (g++: ...tiledL16nbr_count...)
        code = funcs.get(sym) or funcs.get(re.sub(r"(?<=[A-Za-z_])L(?=\d+[A-Za-z_])", "", sym))
        if not code:
            print("icount %s %s %d - %s (no SASS of this kernel)" % (variant, call, index, sym))
            continue
        blocks = sass_blocks(code)
        counts = fitted_counts(host, r, heads, target_n, target_bh)
        est = block_counts(blocks, counts, a.copies)
        raw = sum(n * len(b) for (n, _), b in zip(est, blocks))
        hmma, ldsm = issued(blocks, est, "HMMA"), issued(blocks, est, "LDSM")
        ex = exact.get((variant, call, index, sym))
        if ex:
            totals = {op: at_target({n: v[k] for n, v in ex.items()}, target_n, target_bh, heads)
                      for k, op in enumerate(("HMMA", "LDSM"))}
            sites = fitted_sites(host, products[(variant, call, index, sym)], target_n, target_bh, heads)
            for op, t in totals.items():
                by_site = sum(n for (o, _), n in sites.items() if o == op)
                if abs(by_site - t) > 1e-3 * max(t, 1.0):
                    print("# %s: its %s per call site sum to %.6g, the launch's count is %.6g (the rest takes one "
                          "ratio)" % (sym, op, by_site, t))
            est = anchored(blocks, est, totals, sites)
        total = sum(n * len(b) for (n, _), b in zip(est, blocks))
        print("icount %s %s %d %.6g %s %.6g %.6g %.6g" % (variant, call, index, total, sym, hmma, ldsm, raw))
        rows = []
        for (n, how), b in zip(est, blocks):
            t = sum(truth.get(x[0], 0) for x in b) if truth else None
            rows.append((b[0][0], len(b), n, how, t))
        if truth:
            t_all = sum(truth.values())
            print("# %s: estimated %.4g warp instructions, ncu %.4g (%+.1f%%)" % (sym, total, t_all,
                                                                                 100 * (total / t_all - 1)))
            by_how = collections.defaultdict(lambda: [0.0, 0.0])
            for addr, k, n, how, t in rows:
                by_how[how][0] += n * k
                by_how[how][1] += t
            for how, (e, t) in sorted(by_how.items()):
                print("#   blocks counted by %-6s estimated %.4g, ncu %.4g" % (how, e, t))
        if truth and a.detail:
            lines = collections.defaultdict(lambda: [0.0, 0.0])
            for (n, _), b in zip(est, blocks):
                for x in b:
                    at = "%s:%d" % x[2][0] if x[2] else "?"
                    lines[at][0] += n
                    lines[at][1] += truth.get(x[0], 0)
            print("# source line  estimated  ncu  (the %d largest differences)" % a.detail)
            for at, (e, t) in sorted(lines.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:a.detail]:
                print("# %-28s %10.4g %10.4g" % (at, e, t))
        if a.detail:
            key = (lambda r_: -abs(r_[1] * r_[2] - r_[4])) if truth else (lambda r_: -r_[1] * r_[2])
            print("# address  instructions  executions(est)  how  %s" % ("executions(ncu)" if truth else ""))
            for addr, k, n, how, t in sorted(rows, key=key)[:a.detail]:
                print("# %06x %5d %12.0f %-6s %s" % (addr, k, n, how, "%12.0f" % (t / k) if truth else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
