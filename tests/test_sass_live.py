"""tools/sass_live.py (docs/cuda.md, "Where a sweep's registers go") on a listing whose answer is known by hand: an
`nvdisasm -plr` register table (a GPR section followed by a predicate section whose column numbers repeat 0, 1)
and the `nvdisasm -gi` listing of the same five instructions."""
import importlib.util
import pathlib
import sys

_tools = pathlib.Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(_tools))  # sass_live.py imports its neighbour nvdisasm_listing.py
_spec = importlib.util.spec_from_file_location("sass_live", _tools / "sass_live.py")
sl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sl)

KERNEL = "_Z1kv"
GPRS = 13
HEADER = " " * 40 + "// |   # " + " ".join(str(r) for r in range(GPRS)) + " |  # 0 1 |"


def row(addr, text, gprs, preds=None):
    """A -plr row: the marker of register r under the last digit of r in the header (nvdisasm's layout)."""
    line = list(("        /*%04x*/ %s ;" % (addr, text)).ljust(40) + "// |" + " " * (len(HEADER) - 44))
    gsec, psec = HEADER.index("#"), HEADER.index("#", HEADER.index("|", HEADER.index("#")))
    for marks, sec, n in ((gprs, gsec, GPRS), (preds or {}, psec, 2)):
        cols, p = {}, sec + 2
        for r in range(n):
            cols[r] = p + len(str(r)) - 1
            p += len(str(r)) + 1
        for r, c in marks.items():
            line[cols[r]] = c
    return "".join(line).rstrip() + "\n"


PLR = (HEADER + "\n.text." + KERNEL + ":\n"
       + row(0x00, "MOV R2, c[0x0][0x10]", {2: "^"})
       + row(0x10, "MOV R3, c[0x0][0x14]", {2: ":", 3: "^"})
       + row(0x20, "BAR.SYNC.DEFER_BLOCKING 0x0", {2: ":", 3: ":"})
       + row(0x30, "FADD R4, R3, R2", {2: "v", 3: "v", 4: "^"})
       + row(0x40, "CALL.REL.NOINC `(.L_x_9)", {2: "x", 4: ":"})  # a call marks what it may clobber
       + row(0x50, "BAR.SYNC.DEFER_BLOCKING 0x0", {2: ":", 4: ":", 12: ":"}, {0: ":", 1: ":"}))

GI = ".text." + KERNEL + ":\n" + "".join(
    '\t//## File "/src/csrc/cuda/k.cu", line %d\n        /*%04x*/                   %s ;\n' % (line, addr, text)
    for addr, line, text in ((0x00, 5, "MOV R2, c[0x0][0x10]"), (0x10, 6, "MOV R3, c[0x0][0x14]"),
                             (0x20, 7, "BAR.SYNC.DEFER_BLOCKING 0x0"), (0x30, 8, "FADD R4, R3, R2"),
                             (0x40, 9, "CALL.REL.NOINC `(.L_x_9)"), (0x50, 10, "BAR.SYNC.DEFER_BLOCKING 0x0")))


def test_columns_of_the_gpr_section_only(tmp_path):
    f = tmp_path / "k.plr"
    f.write_text(PLR)
    live, written = sl.read_live(str(f), KERNEL)
    assert live[0x10] == {2, 3}
    assert live[0x30] == {2, 3, 4} and written[0x30] == {4}
    # the predicate section's columns 0 and 1 are not R0 and R1; R12's two digits end under its marker
    assert live[0x50] == {2, 4, 12}


def test_trace_held_and_loop_values(tmp_path):
    (tmp_path / "k.plr").write_text(PLR)
    (tmp_path / "k.sass").write_text(GI)
    ins = sl.read_listing(str(tmp_path / "k.sass"))[KERNEL]
    live, written = sl.read_live(str(tmp_path / "k.plr"), KERNEL)
    why = sl.trace(ins, live, written, 0x50, 0x20, depth=1)
    # R2 set before the loop (the call's clobber mark is not an assignment), R4 inside it; R12 never assigned
    assert why == {("held", "k.cu:5"): 1, ("loop", "k.cu:8"): 1, ("held", "?"): 1}
