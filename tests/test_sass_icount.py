"""tools/sass_icount.py (docs/cuda.md, "Issued instructions") on inputs whose answer is known by hand: a small
`nvdisasm -gi` listing (inline chains, labels, branches) and the block counts from host chain counts. The
host half (the emulator's basic-block counts) is checked by tests/cuda_emu/cost_selftest.cu; the whole
chain needs nvcc and nvdisasm (`make cuda-cost`)."""
import importlib.util
import pathlib
import sys

import pytest

_tools = pathlib.Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(_tools))  # sass_icount.py imports its neighbour nvdisasm_listing.py
_path = _tools / "sass_icount.py"
_spec = importlib.util.spec_from_file_location("sass_icount", _path)
si = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(si)

# two basic blocks: a loop body (label .L_x_1 to the backward branch), then the exit block
LISTING = """.text._Z1kv:
\t//## File "/src/csrc/cuda/a.cuh", line 3 inlined at "/src/csrc/cuda/k.cu", line 9
\t//## File "/src/csrc/cuda/k.cu", line 9
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
\t//## File "/usr/local/cuda/include/cuda_bf16.hpp", line 7 inlined at "/src/csrc/cuda/a.cuh", line 4
\t//## File "/src/csrc/cuda/a.cuh", line 4 inlined at "/src/csrc/cuda/k.cu", line 10
\t//## File "/src/csrc/cuda/k.cu", line 10
        /*0010*/                   FADD R2, R2, R3 ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
\t//## File "/src/csrc/cuda/k.cu", line 11
        /*0030*/                   EXIT ;
"""


def test_read_sass_chains_and_blocks(tmp_path):
    f = tmp_path / "k.sass"
    f.write_text(LISTING)
    code = si.read_sass([str(f)])["_Z1kv"]
    blocks = si.sass_blocks(code)
    assert [[x[0] for x in b] for b in blocks] == [[0x00], [0x10, 0x20], [0x30]]
    # the toolkit's frame is dropped, the repeated outermost line merged
    assert blocks[0][0][2] == (("cuda/a.cuh", 3), ("cuda/k.cu", 9))
    assert blocks[1][0][2] == (("cuda/a.cuh", 4), ("cuda/k.cu", 10))
    assert blocks[2][0][2] == (("cuda/k.cu", 11),)


def test_block_counts_by_hand():
    a1, a2, a3, a4, a7 = ((("a.cuh", i),) for i in (1, 2, 3, 4, 7))
    shared = (("b.cuh", 5), ("a.cuh", 9))
    body = (("e.cuh", 2), ("k.cu", 40))  # an unrolled loop's body: four host blocks of 100 each
    counts = {a1: (100.0, 100.0), a2: (100.0, 100.0), a3: (800.0, 800.0), a4: (100.0, 100.0), a7: (0.0, 0.0),
              shared: (300.0, 300.0), body: (100.0, 400.0)}

    def block(*chains):
        return [(i, "OP", c) for i, c in enumerate(chains)]

    blocks = [
        block(a1, a1, a1, a2, a2, a3, a3, a3, a3),  # own chains: 100 twice, 800 (a rolled host loop) once
        block(shared, shared, shared, shared, shared),  # a copy of the shared code ...
        block(shared, shared, shared, shared, shared),  # ... and another: 300 - 100 left, split in two
        block(shared, a4),  # own chain a4: 100, which the shared chain's other blocks do not get
        block(a7),  # its code never ran on the host
        block((("c.cuh", 1),)),  # no such line on the host: never ran
        # a SASS chain nvcc describes with a frame g++ does not have: the same line's host chain
        block((("a.cuh", 1), ("x.cuh", 50))),
        # the four bodies, a SASS block each: a quarter of one body's count each; with copies, the host's 100 each
        block(body, body), block(body), block(body, body, body), block(body),
    ]
    first = [(100.0, "own"), (100.0, "shared"), (100.0, "shared"), (100.0, "own"), (0.0, "own"), (0.0, "none"),
             (100.0, "own")]
    assert si.block_counts(blocks, counts) == first + [(25.0, "shared")] * 4
    assert si.block_counts(blocks, counts, copies=True) == first + [(100.0, "shared")] * 4


def test_block_counts_of_code_under_a_call_never_made():
    """nvcc may file one inlined copy's code under another copy's call site (fwd_kernel_tc: the maps' sweep body under
    F3's sweep call). A SASS chain through a call site that the host has only in chains that never ran is code that
    never ran, though its innermost line ran elsewhere; a call site the host does not describe at all decides
    nothing."""
    hot = (("t.cuh", 3), ("s.cuh", 9), ("f.cuh", 590))  # the tile's line under F3's call: 500
    cold = (("t.cuh", 3), ("f.cuh", 759), ("s.cuh", 9), ("f.cuh", 736))  # the same line under the maps' call: 0
    counts = {hot: (500.0, 500.0), cold: (0.0, 0.0)}
    blocks = [[(0, "OP", hot)],
              [(0, "OP", (("t.cuh", 3), ("f.cuh", 759), ("s.cuh", 9), ("f.cuh", 590)))],  # the maps' code under F3's
              [(0, "OP", (("t.cuh", 3), ("x.cuh", 50), ("s.cuh", 9), ("f.cuh", 590)))]]  # a frame only nvcc has
    assert si.block_counts(blocks, counts) == [(500.0, "own"), (0.0, "none"), (500.0, "own")]


def test_block_counts_cap_a_shared_block_at_the_chains_executions():
    """With copies: a line split by a branch into two SASS blocks, once a step on the host: each block at most the
    step's count, together at most the host's total."""
    line = (("a.cuh", 5),)
    block = lambda: [(0, "OP", line)]  # noqa: E731
    assert si.block_counts([block(), block()], {line: (100.0, 100.0)}, copies=True) == [(50.0, "shared")] * 2
    assert si.block_counts([block(), block()], {line: (100.0, 300.0)}, copies=True) == [(100.0, "shared")] * 2


def test_lagrange_is_exact_on_quadratics():
    xs = [64.0, 128.0, 192.0]
    f = lambda n: 3 * n * n + 5 * n + 7  # noqa: E731
    assert si.lagrange(xs, [f(x) for x in xs], 4096.0) == f(4096.0)


def test_opcode_of_predicated_and_modified_instructions():
    # the HMMA / LDSM counts the report sets against the emulator's exact mma and ldmatrix counts
    assert si.opcode("HMMA.16816.F32.BF16 R4, R8, R12, R4 ;") == "HMMA"
    assert si.opcode("@!P1 LDSM.16.M88.4 R8, [R2+0x400] ;") == "LDSM"
    assert si.opcode("@PT LDGSTS.E.BYPASS.128 [R9], desc[UR32][R4.64], P1 ;") == "LDGSTS"
    assert si.opcode("EXIT ;") == "EXIT"


def test_anchored_scales_the_product_blocks_to_the_exact_counts():
    # an unrolled k16 loop (4 HMMA, 4 LDSM) and its remainder (1 HMMA, 1 LDSM) estimated at 8 and 4 executions:
    # 36 HMMA and 36 LDSM where the emulator counted 12 and 18; the epilogue block keeps its count
    def block(*ops):
        return [(i, op + " R0 ;", (("a.cuh", 1),)) for i, op in enumerate(ops)]

    blocks = [block(*(["HMMA.16816.F32.BF16"] * 4 + ["LDSM.16.M88.4"] * 4 + ["IMAD"] * 2)),
              block("HMMA.16816.F32.BF16", "LDSM.16.M88.4", "IADD3"),
              block("FFMA", "FFMA", "BRA")]
    est = [(8.0, "shared"), (4.0, "shared"), (5.0, "own")]
    out = si.anchored(blocks, est, {"HMMA": 12.0, "LDSM": 18.0}, {})  # no call sites: one ratio per opcode
    # r_HMMA = 12 / 36, r_LDSM = 18 / 36: a block with as many of each scales by their mean, 5 / 12
    assert [how for _, how in out] == ["shared*", "shared*", "own"]
    assert [n for n, _ in out] == pytest.approx([8.0 * 5 / 12, 4.0 * 5 / 12, 5.0])
    hmma = sum(n * sum(1 for x in b if x[1].startswith("HMMA")) for (n, _), b in zip(out, blocks))
    assert hmma == pytest.approx(36 * 5 / 12)
    # nothing to anchor to: the counts stand
    assert si.anchored(blocks[2:], est[2:], {"HMMA": 0.0, "LDSM": 0.0}, {}) == est[2:]


def test_anchored_per_call_site():
    # two products through the same helper (tile.cuh:33) from two call sites (k.cu:10, k.cu:20): the first's
    # k16 loop unrolled by 4 with a remainder (estimated 4x too often), the second's rolled (estimated right);
    # one ratio per launch would scale both by the same mean
    def block(site, *ops):
        chain = (("cuda/mma.cuh", 150), ("cuda/tile.cuh", 33), ("cuda/k.cu", site))
        return [(i, op + " R0 ;", chain if op in ("HMMA", "LDSM") else (("cuda/k.cu", site),))
                for i, op in enumerate(ops)]

    blocks = [block(10, "HMMA", "HMMA", "HMMA", "HMMA", "IMAD"),  # the unrolled copy
              block(10, "HMMA", "IMAD"),  # its remainder
              block(20, "HMMA", "LDSM", "IMAD"),  # the rolled loop
              block(30, "LDSM")]  # a site the host does not have: the ratio of what is left
    est = [(100.0, "own"), (100.0, "shared"), (50.0, "own"), (10.0, "own")]
    host = (("cuda/tile.cuh", 33), ("cuda/k.cu", 10))
    sites = {("HMMA", host): 100.0, ("HMMA", (("cuda/tile.cuh", 33), ("cuda/k.cu", 20))): 50.0,
             ("LDSM", (("cuda/tile.cuh", 33), ("cuda/k.cu", 20))): 50.0}
    out = si.anchored(blocks, est, {"HMMA": 150.0, "LDSM": 55.0}, sites)
    # site 10: 500 estimated, 100 exact (r = 1/5); site 20: exact as estimated; the LDSM of site 30, which the
    # host does not have (not k.cu:20's: another line of the same file), the ratio of what is left: 5 / 10
    assert [n for n, _ in out] == pytest.approx([20.0, 20.0, 50.0, 5.0])
    hmma = sum(n * sum(1 for x in b if x[1].startswith("HMMA")) for (n, _), b in zip(out, blocks))
    assert hmma == pytest.approx(150.0)
    # a site none of whose blocks the estimate ran: its count spread over its copies (3 HMMA, 60 executions)
    blocks.append(block(40, "HMMA", "HMMA", "IMAD"))
    blocks.append(block(40, "HMMA", "BRA"))
    est += [(0.0, "shared"), (0.0, "own")]
    sites[("HMMA", (("cuda/tile.cuh", 33), ("cuda/k.cu", 40)))] = 60.0
    out = si.anchored(blocks, est, {"HMMA": 210.0, "LDSM": 55.0}, sites)
    assert out[4:] == [(20.0, "site"), (20.0, "site")]
    assert [n for n, _ in out[:4]] == pytest.approx([20.0, 20.0, 50.0, 5.0])


def test_site_key_drops_the_intrinsics_header():
    # the header's device and emulator branches are different lines: a site is the chain above it
    assert si.site_key((("cuda/mma.cuh", 53), ("cuda/tile.cuh", 33), ("cuda/k.cu", 9))) == \
        (("cuda/tile.cuh", 33), ("cuda/k.cu", 9))


def test_read_bbs_takes_each_launchs_exact_counts(tmp_path):
    f = tmp_path / "bbs.txt"
    f.write_text("target 4096 16\n"
                 "launch seed fwd 0 192 1 _Z1kv\nexact 120 80\nproduct HMMA 51b 120\nproduct LDSM 52c 80\n4a0 7\n"
                 "launch seed fwd 0 384 1 _Z1kv\nexact 480 320\nproduct HMMA 51b 480\nproduct LDSM 52c 320\n4a0 28\n")
    runs, exact, products, heads, target = si.read_bbs(str(f))
    key = ("seed", "fwd", 0, "_Z1kv")
    assert runs[key] == {192.0: {0x4a0: 7}, 384.0: {0x4a0: 28}}
    assert exact[key] == {192.0: (120.0, 80.0), 384.0: (480.0, 320.0)}
    assert products[key] == {192.0: {("HMMA", 0x51b): 120, ("LDSM", 0x52c): 80},
                             384.0: {("HMMA", 0x51b): 480, ("LDSM", 0x52c): 320}}
    assert (heads, target) == (1.0, (4096.0, 16.0))


def test_function_sites_reach_the_out_of_line_callees_that_never_ran():
    # kernel k (its sites ran) calls drop (out of line, never ran), which calls philox; other is not reached. The
    # callees' sites come in at count 0, so their SASS copies match their own host chains (0), not another line's
    # chain of the same innermost frame
    dis = """
0000000000001000 <k>:
    1000:\tcall   1100 <__sanitizer_cov_trace_pc>
    1005:\tmov    %eax,%ebx
    1007:\tcall   2000 <drop>
    100c:\tcall   1100 <__sanitizer_cov_trace_pc>
    1011:\tret

0000000000001100 <__sanitizer_cov_trace_pc>:
    1100:\tret

0000000000002000 <drop>:
    2000:\tcall   1100 <__sanitizer_cov_trace_pc>
    2005:\tcall   3000 <philox>
    200a:\tret

0000000000003000 <philox>:
    3000:\tcall   1100 <__sanitizer_cov_trace_pc>
    3005:\tcall   3000 <philox>
    300a:\tret

0000000000004000 <other>:
    4000:\tcall   1100 <__sanitizer_cov_trace_pc>
    4005:\tret
"""
    host = si.HostCode("unused", dis=dis)
    assert host.calls == [0x1005, 0x1011, 0x2005, 0x3005, 0x4005]
    assert host.function_sites({0x1005}) == {0x1005, 0x1011, 0x2005, 0x3005}
    assert host.block(0x1005) == [0x1005, 0x1007]
