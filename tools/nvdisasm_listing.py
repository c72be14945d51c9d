"""nvdisasm_listing.py -- reads an `nvdisasm -gi` listing (a cubin built with -lineinfo): per function, its SASS
instructions in order, each with its address, text, source inline chain and the labels just before it, and an
instruction's opcode. The one parser of sass_icount.py, sass_loop_lines.py and sass_live.py."""
import re
from typing import NamedTuple

LINE_RE = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
INSN_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
LABEL_RE = re.compile(r"^(\.L_x_\d+):")


class Insn(NamedTuple):
    address: int
    text: str  # as listed, a predicate (@P0, @!UP1) included
    chain: tuple  # ((source path, line), ...), innermost frame first; () before any line information
    labels: tuple  # the labels (".L_x_12") that name this instruction's address


def opcode(text):
    """The opcode of a SASS instruction without its modifiers ("@P0 HMMA.16816.F32.BF16 ..." -> "HMMA")."""
    w = text.split()
    return (w[1] if len(w) > 1 and w[0].startswith("@") else w[0] if w else "").split(".")[0]


def read_listing(path):
    """{function symbol: [Insn, ...]}: the .text.<symbol> sections of the listing (a section ends at the next
    section directive). A chain is the run of `//## File` lines up to the one without "inlined at"."""
    funcs, cur, chain, frames, labels = {}, None, (), [], []
    with open(path) as f:
        for line in f:
            if line.startswith(".text."):
                cur = funcs.setdefault(line.strip()[6:].rstrip(":"), [])
                chain, frames, labels = (), [], []
                continue
            if line.lstrip().startswith(".section"):
                cur = None
                continue
            if cur is None:
                continue
            m = LINE_RE.search(line)
            if m:
                frames.append((m.group(1), int(m.group(2))))
                if m.group(3) is None:  # the outermost frame ends a chain
                    chain, frames = tuple(frames), []
                continue
            m = LABEL_RE.match(line.strip())
            if m:
                labels.append(m.group(1))
                continue
            m = INSN_RE.match(line)
            if m:
                cur.append(Insn(int(m.group(1), 16), m.group(2), chain, tuple(labels)))
                labels = []
    return funcs
