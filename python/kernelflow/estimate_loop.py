"""The KV tile loop of a decode kernel's SASS and its instruction counts per pipe.

Finding the loop. Every backward branch (a BRA whose target lies at or before it) closes a loop
[target, branch]. The decode kernel nests three: rounds of pieces, pieces, KV tiles. The KV tile
loop is the innermost loop that holds both tensor instructions (HMMA) and a block barrier
(BAR.SYNC): every warp multiplies and the block synchronizes once per tile, and no other loop of
the kernel does both. The loop enclosing it (the innermost loop that strictly contains it) is the
piece loop; its instructions outside the tile loop are what a piece costs besides its tiles.

Counting. The loop body is cut into basic blocks (at branch targets and after branches). A block
that dominates the loop's closing branch runs on every tile; the others are conditional (the ring
refill, skipped past the end of a piece; the O rescale, skipped when no row's maximum moved; the
bad-page report). Conditional blocks count once, as if taken, except those that hold tensor
instructions: with deferred P V (the 64-row tile) each warp runs one of two copies of P V, so the
conditional tensor blocks are weighted by the share that brings a warp's tensor instructions per
tile to the tile's math (rows x tokens x 1088 multiply-adds over m16n8k16, per warp). An inner
loop inside the tile loop (the producer stepping to the next piece) counts once.

Units per pipe, per warp: tensor in m16n8k16 HMMAs (m16n8k8 is half of one); shared in 128-byte
wavefronts (LDSM.x4 and LDS.128 are 4, LDS.64 2, a 32-bit access or a shuffle 1; bank conflicts
are not modeled: the kernel swizzles its tiles); global likewise in 128-byte L1 wavefronts;
every other pipe in instructions. `issue` counts every instruction once (one issue slot each).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

PIPES = ("tensor", "fp32", "int", "conversion", "mufu", "shared", "global", "barrier", "other")

_OPS = {
    "tensor": "HMMA IMMA DMMA",
    "fp32": "FFMA FMUL FADD FMNMX FSETP FSEL FCHK FSWZADD FFMA32I FMUL32I FADD32I "
            "HFMA2 HADD2 HMUL2 HMNMX2 HSETP2 HSET2 HFMA2MMA",
    "int": "IMAD IADD3 IADD LOP3 LOP SHF SHL SHR LEA LEA.HI ISETP SEL PRMT IABS IMNMX VIADD "
           "VIMNMX POPC FLO BREV BMSK PLOP3 MOV P2R R2P IDP IDP4A IMUL",
    "conversion": "F2F F2FP F2I I2F I2FP F2IP I2I FRND",
    "mufu": "MUFU",
    "shared": "LDS STS LDSM ATOMS SHFL MOVM",
    "global": "LDG STG LDGSTS RED ATOMG ATOM LD ST CCTL",
    "barrier": "BAR DEPBAR LDGDEPBAR MEMBAR WARPSYNC ERRBAR",
}
_PIPE_OF = {op: pipe for pipe, ops in _OPS.items() for op in ops.split()}
_WIDTH_WAVEFRONTS = {"64": 2, "128": 4}
_BRANCHES = {"BRA", "CALL", "JMP", "BRX", "JMX"}
_ENDS = {"EXIT", "RET", "BRA", "JMP", "BRX", "JMX", "KILL"}


def pipe_of(instr):
    """The pipe an instruction issues to (PIPES); uniform-datapath, control and special-register
    instructions are 'other'."""
    return _PIPE_OF.get(instr.op, "other")


def units(instr):
    """The instruction's work in its pipe's units (see the module docstring)."""
    pipe = pipe_of(instr)
    mods = instr.opcode.split(".")[1:]
    if pipe == "tensor":
        return 0.5 if "1688" in mods else 1.0
    if instr.op == "LDSM":
        m = re.search(r"\.(\d)$", instr.opcode)
        return float(m.group(1)) if m else 1.0
    if pipe in ("shared", "global") and instr.op not in ("SHFL", "MOVM", "CCTL"):
        for mod in mods:
            if mod in _WIDTH_WAVEFRONTS:
                return float(_WIDTH_WAVEFRONTS[mod])
    return 1.0


def branch_target(instr):
    """Target address of a direct branch or call, else None."""
    if instr.op not in _BRANCHES:
        return None
    m = re.search(r"(0x[0-9a-f]+)\s*$", instr.operands)
    return int(m.group(1), 16) if m else None


def _falls_through(instr):
    """Whether control can reach the next instruction: not after an unguarded BRA/EXIT/RET."""
    if instr.op not in _ENDS:
        return True
    guarded = instr.guard not in ("", "@PT")
    has_pred_operand = instr.op == "BRA" and re.match(r"!?U?P[0-9]", instr.operands) is not None
    # BRA.DIV leaves for an out-of-line copy only when the warp has diverged.
    return guarded or has_pred_operand or instr.opcode == "BRA.DIV"


def loops(instrs):
    """[(head address, latch address)] of every backward branch, in code order."""
    found = []
    for ins in instrs:
        t = branch_target(ins)
        if t is not None and t <= ins.addr and ins.op == "BRA":
            found.append((t, ins.addr))
    return found


def _inside(instrs, loop):
    head, latch = loop
    return [i for i in instrs if head <= i.addr <= latch]


def tile_loop(instrs):
    """(head, latch) of the KV tile loop: the innermost loop holding HMMA and BAR.SYNC."""
    candidates = []
    for loop in loops(instrs):
        body = _inside(instrs, loop)
        if any(i.op == "HMMA" for i in body) and any(i.op == "BAR" for i in body):
            candidates.append(loop)
    if not candidates:
        raise ValueError("no loop holds both HMMA and BAR: not a decode kernel's tile loop")
    return min(candidates, key=lambda lp: lp[1] - lp[0])


def enclosing_loop(instrs, inner):
    """The innermost loop that strictly contains `inner`, or None."""
    outer = [lp for lp in loops(instrs)
             if lp[0] <= inner[0] and inner[1] <= lp[1] and lp != inner]
    return min(outer, key=lambda lp: lp[1] - lp[0]) if outer else None


@dataclass
class Block:
    first: int  # index into the instruction list
    last: int  # inclusive
    succs: list = field(default_factory=list)  # block indices


def basic_blocks(instrs):
    """The instructions cut into basic blocks, with their successors (within the list)."""
    addr_index = {ins.addr: k for k, ins in enumerate(instrs)}
    leaders = {0}
    for k, ins in enumerate(instrs):
        t = branch_target(ins)
        if t is not None and t in addr_index:
            leaders.add(addr_index[t])
        if (t is not None or ins.op in _ENDS) and k + 1 < len(instrs):
            leaders.add(k + 1)
    starts = sorted(leaders)
    blocks = [Block(s, (starts[n + 1] if n + 1 < len(starts) else len(instrs)) - 1)
              for n, s in enumerate(starts)]
    block_at = {b.first: n for n, b in enumerate(blocks)}
    for n, b in enumerate(blocks):
        end = instrs[b.last]
        t = branch_target(end)
        if t is not None and t in addr_index:
            b.succs.append(block_at[addr_index[t]])
        if _falls_through(end) and n + 1 < len(blocks):
            b.succs.append(n + 1)
    return blocks


def _dominators_of_exit(blocks, entry, exit_block):
    """Blocks on every path from entry to exit_block (iterative dominator sets over the blocks
    between them that entry reaches)."""
    span = set(range(entry, exit_block + 1))
    members, todo = {entry}, [entry]
    while todo:
        for s in blocks[todo.pop()].succs:
            if s in span and s not in members:
                members.add(s)
                todo.append(s)
    preds = {n: [] for n in members}
    for n in members:
        for s in blocks[n].succs:
            if s in members:
                preds[s].append(n)
    dom = {n: set(members) for n in members}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for n in sorted(members - {entry}):
            ps = [dom[p] for p in preds[n]]
            new = ({n} | set.intersection(*ps)) if ps else {n}
            if new != dom[n]:
                dom[n], changed = new, True
    return dom[exit_block]


@dataclass
class LoopCounts:
    """Per warp, per trip of a loop: units per pipe (PIPES), issue slots, and how the tensor
    instructions split between blocks that always run and conditional ones."""

    pipes: dict
    issue: float
    instructions: int  # static count of the loop body
    tensor_always: float
    tensor_conditional: float
    conditional_tensor_weight: float


def count_loop(instrs, loop, tensor_per_trip=None):
    """Counts of one trip of `loop` (module docstring). tensor_per_trip: the tensor units a warp
    executes per trip by the math, which sets the weight of conditional tensor blocks."""
    blocks = basic_blocks(instrs)
    index_of = {ins.addr: k for k, ins in enumerate(instrs)}
    first, last = index_of[loop[0]], index_of[loop[1]]
    block_of = {}
    for n, b in enumerate(blocks):
        for k in range(b.first, b.last + 1):
            block_of[k] = n
    always = _dominators_of_exit(blocks, block_of[first], block_of[last])
    t_always = t_cond = 0.0
    cond_tensor_blocks = set()
    for k in range(first, last + 1):
        if pipe_of(instrs[k]) == "tensor":
            if block_of[k] in always:
                t_always += units(instrs[k])
            else:
                t_cond += units(instrs[k])
                cond_tensor_blocks.add(block_of[k])
    weight = 1.0
    if tensor_per_trip is not None and t_cond > 0:
        weight = min(1.0, max(0.0, (tensor_per_trip - t_always) / t_cond))
    pipes = dict.fromkeys(PIPES, 0.0)
    issue = 0.0
    for k in range(first, last + 1):
        w = weight if block_of[k] in cond_tensor_blocks else 1.0
        pipes[pipe_of(instrs[k])] += w * units(instrs[k])
        issue += w
    return LoopCounts(pipes, issue, last - first + 1, t_always, t_cond, weight)


def count_outside(instrs, outer, inner):
    """Per warp: units per pipe and issue slots of `outer`'s body outside `inner` (static, each
    instruction once): what one trip of the outer loop costs besides the inner one."""
    pipes = dict.fromkeys(PIPES, 0.0)
    issue = 0.0
    for ins in _inside(instrs, outer):
        if not inner[0] <= ins.addr <= inner[1]:
            pipes[pipe_of(ins)] += units(ins)
            issue += 1.0
    return pipes, issue
