#!/usr/bin/env python3
"""Static SASS of a kernel's loop body, attributed to source lines (docs/cuda.md, "Where the backward's
instructions go").

Reads the output of `nvdisasm -gi` (line info with the inlining chain; the cubin built with -lineinfo) of one
cubin, takes one kernel (a substring of its mangled name), and keeps the instructions whose inlining chain
passes through a loop of the source: --loop FILE:PATTERN names the first line of FILE (a path suffix) matching
the regular expression PATTERN, and the loop is that line up to its matching closing brace. For that body it
prints the instruction count, the opcode classes (mma, exps, shared loads, local memory, integer, FP32,
control), the top source lines (innermost frame of each instruction; --frame FILE attributes to the innermost
frame in FILE instead), and the inner loops (backward branches inside the body) with their sizes. --cold
FILE:PATTERN (same form) marks code inside the body that the measured call does not run (fallbacks, options):
counted apart, left out of the "hot" body; --bench-path adds what the benchmark's call (bf16, no mask, no
option) does not run; --groups prints the hot body by what it does (staging, product loops, mma, ...).

  nvdisasm -gi x.cubin > x.sass
  python tools/sass_loop_lines.py x.sass b1_kernelI13__nv_bfloat16Lb0E --loop 'sweeps.cuh:while \\(j0 < end\\)' \\
      --bench-path --groups
"""
import argparse
import collections
import os
import re
import sys

from nvdisasm_listing import read_listing

TARGET_RE = re.compile(r'`\((\.L_x_\d+)\)')

# --bench-path: what the benchmark's call (bf16, no mask, no option, finite inputs) does not run inside the tiled
# kernels' loops: the FFMA row products of tiles with a non-finite key, element-wise staging, raw keys'
# prepare_tile, partial tiles' per-entry sets, the scores' attn_bias / ALiBi / softcap terms (either form), the forward's
# maps sweep (inspection only)
BENCH_COLD = [
    r'tile.cuh:row_ffma\(C \*O',
    r'tile.cuh:for \(int64_t e = tid; e < \(int64_t\)nrows \* fp',
    r'sweeps.cuh:^__device__ void prepare_tile',
    r'sweeps.cuh:if \(B.kp.raw\) \{',
    r'sweeps.cuh:for \(int c = 0; c < 2 \* NT; c\+\+\)',
    r'visibility.cuh:void pair_sets',
    r'sweeps.cuh:if \(other \|\| capped\)',
    r'sweeps.cuh:if \(extras\) xv = score_extras',
    r'sweeps.cuh:if \(capped && c.cap',
    r'sweeps.cuh:if \(other && L.act\[r\] && j < p.N\) xv',
    r'backward.cuh:void zero_row_ops',
    r'forward.cuh:^__device__ void sweep_maps',
]

# --groups: the hot body by what it does (functions of tile.cuh by their definition lines)
GROUP_FUNCS = {
    'staging': [r'tile.cuh:^__device__ void tile_load', r'tile.cuh:^__device__ void tiles_load',
                r'tile.cuh:^__device__ void tile_load_elems', r'tile.cuh:^__device__ void vecs_load'],
    'products': [r'tile.cuh:void score_mma', r'tile.cuh:void row_mma', r'tile.cuh:void col_mma'],
}


def group_of(op, ch, ranges):
    def inr(rs):
        return any(f == rf and lo <= l <= hi for f, l in ch for rf, lo, hi in rs)
    if op.startswith(('LDL', 'STL')):
        return 'spills (LDL / STL)'
    if op.startswith('HMMA'):
        return 'mma'
    if op.startswith('LDSM'):
        return 'ldmatrix'
    if op.startswith('MUFU'):
        return 'exp (MUFU)'
    if op.startswith('LDGSTS') or inr(ranges['staging']):
        return 'staging (tile_load, vecs_load, cp.async)'
    if inr(ranges['products']) or (ch and ch[0][0].endswith('sm_20_intrinsics.hpp')):
        return 'product loops, operand addresses, C-fragment round trips'
    return 'epilogue FP math' if opclass(op).startswith('fp') else 'epilogue integer, control, shared, other'


CLASSES = [  # first match wins
    ('mma', re.compile(r'^HMMA')),
    ('exp / sfu', re.compile(r'^MUFU')),
    ('shared ld/st', re.compile(r'^(LDSM|LDS|STS|LDGSTS|ATOMS)')),
    ('local (spills)', re.compile(r'^(LDL|STL)')),
    ('global', re.compile(r'^(LDG|STG|LD|ST|RED|ATOMG)\b')),
    ('fp32 / fp64 math', re.compile(r'^(FFMA|FADD|FMUL|FMNMX|FSETP|FSEL|FCHK|FRND|F2F|F2I|I2F|DADD|DMUL|DFMA|DSETP|'
                                    r'HADD2|HFMA2|HMUL2|F2FP)')),
    ('integer / predicate', re.compile(r'^(IMAD|IADD3|IADD|VIADD|LOP3|ISETP|SEL|SHF|LEA|IABS|IMNMX|VIMNMX|POPC|FLO|'
                                       r'BREV|PRMT|PLOP3|P2R|R2P|MOV|IMUL|SGXT|BMSK|UIADD3|ULOP3|UMOV|UISETP|USEL|'
                                       r'ULEA|USHF|UIMAD|CS2R|S2R|S2UR|LDC|ULDC|R2UR|CS2UR)')),
    ('shuffle / vote', re.compile(r'^(SHFL|VOTE|MATCH|REDUX)')),
    ('control / sync', re.compile(r'^(BRA|BSSY|BSYNC|BAR|WARPSYNC|CALL|RET|EXIT|DEPBAR|YIELD|BMOV|NANOSLEEP|JMP|'
                                  r'BREAK|KILL)')),
]


def opclass(op):
    for name, rx in CLASSES:
        if rx.match(op):
            return name
    return 'other'


def kernel_instructions(path, name):
    """The one kernel whose mangled name contains `name`: its symbol and its instructions as (address, op text
    without its predicate, chain [(file, line), innermost first], labels before it)."""
    funcs = read_listing(path)
    hits = [f for f in funcs if name in f]
    if len(hits) != 1:
        sys.exit('kernel %r: %d sections match (%s)' % (name, len(hits), '; '.join(h[:120] for h in hits)))
    return hits[0], [(x.address, re.sub(r'^\{?\s*@!?U?P\w+\s+', '', x.text.strip()), list(x.chain), list(x.labels))
                     for x in funcs[hits[0]]]


def loop_range(spec, files, required=True):
    """FILE:PATTERN -> (full path, first line, last line) from the source the line info names; None where not
    required and nothing matches."""
    fsuf, pat = spec.split(':', 1)
    cands = sorted(f for f in files if f.endswith(fsuf))
    if len(cands) != 1:
        if not required:
            return None
        sys.exit('--loop %s: %d source files end with %r' % (spec, len(cands), fsuf))
    src = cands[0]
    with open(src) as fh:
        text = fh.read().split('\n')
    rx = re.compile(pat)
    for i, ln in enumerate(text):
        if rx.search(ln):
            if '{' not in ln and ln.rstrip().endswith(';'):
                return src, i + 1, i + 1  # a one-line statement
            depth, seen = 0, False
            for k in range(i, len(text)):
                depth += text[k].count('{') - text[k].count('}')
                seen = seen or '{' in text[k]
                if seen and depth <= 0:
                    return src, i + 1, k + 1
            sys.exit('--loop %s: no closing brace' % spec)
    if not required:
        return None
    sys.exit('--loop %s: no line matches' % spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('sass', help='nvdisasm -gi output of the cubin')
    ap.add_argument('kernel', help='a substring of the kernel\'s mangled name (one match)')
    ap.add_argument('--loop', action='append', required=True,
                    help='FILE:PATTERN, the loop (the line matching PATTERN to its closing brace); repeatable')
    ap.add_argument('--cold', action='append', default=[],
                    help='FILE:PATTERN as --loop: code the measured call does not run (fallbacks, options), left '
                         'out of the hot body and counted apart; repeatable')
    ap.add_argument('--bench-path', action='store_true',
                    help='add the code the benchmark\'s call does not run to --cold (BENCH_COLD above)')
    ap.add_argument('--groups', action='store_true', help='also print the hot body by what it does')
    ap.add_argument('--frame', help='attribute to the innermost frame in this file (path suffix) where there is one')
    ap.add_argument('--top', type=int, default=25)
    args = ap.parse_args()

    title, ins = kernel_instructions(args.sass, args.kernel)
    ins = [x for x in ins if not x[1].startswith('NOP')]
    files = {f for _, _, ch, _ in ins for f, _ in ch}
    ranges = [loop_range(s, files) for s in args.loop]

    cold_ranges = [loop_range(s, files) for s in args.cold]
    if args.bench_path:
        cold_ranges += [r for r in (loop_range(s, files, False) for s in BENCH_COLD) if r]

    def in_any(ch, rs):
        return any(f == rf and lo <= l <= hi for f, l in ch for rf, lo, hi in rs)

    body = [x for x in ins if in_any(x[2], ranges)]
    cold = [x for x in body if in_any(x[2], cold_ranges)]
    hot = [x for x in body if not in_any(x[2], cold_ranges)]
    print('kernel %s' % title)
    for rf, lo, hi in ranges:
        print('loop   %s:%d-%d' % (os.path.basename(rf), lo, hi))
    for rf, lo, hi in cold_ranges:
        print('cold   %s:%d-%d' % (os.path.basename(rf), lo, hi))
    print('instructions: %d in the kernel (NOPs left out), %d in the loop body: %d hot, %d cold'
          % (len(ins), len(body), len(hot), len(cold)))

    def where(ch):
        if not ch:
            return '?'
        if args.frame:
            for f, l in ch:
                if f.endswith(args.frame):
                    return '%s:%d' % (os.path.basename(f), l)
        return '%s:%d' % (os.path.basename(ch[0][0]), ch[0][1])

    # inner loops of the hot body: a branch to a label at or before it, both hot, not a shuffle's retry loop
    addr_of = {}
    for a, _, _, labs in ins:
        for lab in labs:
            addr_of[lab] = a
    hset = {x[0] for x in hot}
    loops = []
    for a, text, ch, _ in hot:
        m = TARGET_RE.search(text)
        if not m or not text.split()[0].startswith('BRA'):
            continue
        tgt = addr_of.get(m.group(1))
        if tgt is None or tgt > a or tgt not in hset or ch[0][0].endswith('intrinsics.hpp'):
            continue
        site = next(('%s:%d' % (os.path.basename(f), l) for f, l in ch if f != ch[0][0]), '?')
        loops.append((tgt, a, where(ch), site))

    cls = collections.Counter(opclass(x[1].split()[0]) for x in hot)
    print('\nby class (hot body):')
    for name, n in cls.most_common():
        print('  %-22s %6d  %5.1f%%' % (name, n, 100.0 * n / max(len(hot), 1)))

    if args.groups:
        granges = {k: [r for r in (loop_range(x, files, False) for x in v) if r] for k, v in GROUP_FUNCS.items()}
        grp = collections.Counter(group_of(x[1].split()[0], x[2], granges) for x in hot)
        print('\nby group (hot body):')
        for name, n in grp.most_common():
            print('  %-58s %6d  %5.1f%%' % (name, n, 100.0 * n / max(len(hot), 1)))

    per, ops = collections.Counter(), collections.defaultdict(collections.Counter)
    for x in hot:
        per[where(x[2])] += 1
        ops[where(x[2])][x[1].split()[0].split('.')[0]] += 1
    print('\ntop lines (hot body):')
    for loc, n in per.most_common(args.top):
        mix = ', '.join('%s %d' % kv for kv in ops[loc].most_common(4))
        print('  %6d  %5.1f%%  %-26s %s' % (n, 100.0 * n / max(len(hot), 1), loc, mix))

    print('\ninner loops of the hot body (they run per k16 step, chunk, ...: the compiler unrolls and peels '
          'some, so a static count is not a dynamic one): first..last address, instructions, branch line, call site')
    for lo, hi, loc, site in loops:
        print('  0x%05x..0x%05x  %5d  %-22s %s' % (lo, hi, sum(1 for x in hot if lo <= x[0] <= hi), loc, site))
    percold = collections.Counter(where(x[2]) for x in cold)
    print('\ncold code by line (static): ' + ', '.join('%s %d' % kv for kv in percold.most_common(8)))


if __name__ == '__main__':
    main()
