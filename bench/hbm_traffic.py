"""An estimate of a compiled program's HBM traffic per execution, read from its optimized HLO.

XLA's `compiled.cost_analysis()` answers None for a deviceless GPU compile, so this reads
`compiled.as_text()` instead and counts kernel-boundary traffic: every instruction the GPU
runs as a kernel (or a memcpy, a library call, a collective) reads its operands from HBM and
writes its outputs to HBM. Per instruction of a computation that runs on the host's schedule
(the entry, while bodies and conditions, conditional branches, async-wrapped computations):

- free (no kernel): parameter, constant, tuple, get-tuple-element, bitcast, the `*-done`
  half of an async pair, optimization-barrier, after-all, add-dependency;
- while: its body and condition, times the trip count XLA states (`known_trip_count` in the
  backend config); without one they count once and the result says the trip count is unknown;
- conditional: its largest branch; call and async-start: the called computation;
- a fusion: each operand's bytes read, each output's bytes written, except where the fused
  computation shows less is touched:
  - a fused parameter used only as the sliced operand of dynamic-slice / slice / gather reads
    only those results' bytes (the decode's attention reading its span of the cache);
  - a root (or a root tuple's element) that is a dynamic-update-slice or scatter of a fused
    parameter updates that buffer in place (XLA's buffer assignment shares it; where it could
    not, it adds a `copy`, counted on its own): it writes only the update's bytes, and that
    parameter is not read unless something else in the fusion reads it;
  - a dynamic-update-slice or scatter of a fused parameter that is not a root (XLA re-derives
    the updated buffer inside a fusion that only slices it: a prefill's attention gathering
    its rows from the layer cache just written) reads the parameter as its own users do:
    slices of it read their bytes (the update is read as the operand it is);
  - a dynamic-slice fusion whose hero is a copy (`"dynamic_slice_fusion"` custom fusion) is a
    device-to-device copy of the slice: the slice read, the slice written;
- any other instruction (copy, custom-call such as a cuBLAS gemm or cuDNN attention, sort,
  collective, an unfused dynamic-(update-)slice / scatter / gather with the same rules):
  operands read, outputs written; a custom-call's trailing u8/s8 workspace output is not
  counted, nor an async start's echo of its operands.

What it ignores: caching (L2 hits for an operand read twice, e.g. a small vector in every
kernel), reuse inside a fusion (a Triton gemm's tiles read more than once count once), reads
of only part of an operand other than the slicing ops above (a masked or data-dependent read
counts the whole operand), kernels' own scratch, and host<->device copies. So it is an
estimate of what the kernels must move if each reads its inputs and writes its outputs once.
"""

from __future__ import annotations

import dataclasses
import re

# bytes per element; sub-byte types round up per element (small tensors only)
DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
               "c64": 8, "c128": 16, "token": 0}
_ARRAY = re.compile(r"\b([a-z]\w*)\[([^\]]*)\]")
FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
        "add-dependency", "optimization-barrier", "domain"}
SLICING = {"dynamic-slice", "slice", "gather"}
IN_PLACE = {"dynamic-update-slice", "scatter"}


def array_bytes(shape: str) -> int:
    """Bytes of every array in an HLO shape string (a tuple's elements summed)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype.startswith("f8") or dtype.startswith("f4"):
            size = 1
        elif dtype in DTYPE_BYTES:
            size = DTYPE_BYTES[dtype]
        else:
            continue
        n = 1
        for d in filter(None, dims.replace("<=", "").split(",")):
            n *= int(d)
        total += n * size
    return total


def _elements(shape: str) -> list[str]:
    """A tuple shape's top-level elements (an array shape: itself)."""
    shape = shape.strip()
    if not shape.startswith("("):
        return [shape]
    out, depth, cur = [], 0, ""
    for ch in re.sub(r"/\*.*?\*/", "", shape[1:-1]):
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


@dataclasses.dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False
    index: int = -1            # a parameter's number

    @property
    def bytes(self) -> int:
        return array_bytes(self.shape)

    def attr(self, key: str) -> str | None:
        m = re.search(rf'\b{key}=(?:"([^"]*)"|(%?[\w.\-]+))', self.attrs)
        return (m.group(1) or m.group(2).lstrip("%")) if m else None


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0:
            return i + 1
    return len(text)


_HEAD = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")


def parse_instr(line: str) -> Instr | None:
    m = _HEAD.match(line)
    if not m:
        return None
    pos = m.end()
    if line[pos] == "(":
        end = _balanced(line, pos)
    else:
        end = line.index(" ", pos)
        if "{" in line[pos:end] and not line[pos:end].endswith("}"):   # layout with spaces
            end = _balanced(line, line.index("{", pos))
    shape = line[pos:end]
    rest = line[end:].lstrip()
    om = re.match(r"([\w\-]+)\(", rest)
    if not om:
        return None
    close = _balanced(rest, om.end() - 1)
    inner = rest[om.end():close - 1]
    opcode = om.group(1)
    if opcode in ("parameter", "constant"):
        ins = Instr(m.group(2), shape, opcode, [], rest[close:], bool(m.group(1)))
        ins.index = int(inner) if opcode == "parameter" else -1
        return ins
    operands = re.findall(r"%([\w.\-]+)", inner)
    if not operands and inner.strip():      # text without % sigils: "f32[2] x, y"
        operands = [t.split()[-1] for t in inner.split(",") if t.strip()]
    return Instr(m.group(2), shape, opcode, operands, rest[close:], bool(m.group(1)))


@dataclasses.dataclass
class Computation:
    name: str
    instrs: list[Instr]
    entry: bool = False

    def __post_init__(self):
        self.by_name = {i.name: i for i in self.instrs}
        self.users: dict[str, list[Instr]] = {}
        for i in self.instrs:
            for o in i.operands:
                self.users.setdefault(o, []).append(i)
        self.params = {i.index: i for i in self.instrs if i.opcode == "parameter"}

    @property
    def root(self) -> Instr:
        return next((i for i in self.instrs if i.root), self.instrs[-1])


def parse_module(hlo: str) -> dict[str, Computation]:
    comps, cur, name, entry = {}, None, None, False
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$", line)
        if head and not line.startswith(" "):
            name, entry, cur = head.group(2), bool(head.group(1)), []
            continue
        if line.startswith("}") and cur is not None:
            comps[name] = Computation(name, cur, entry)
            cur = None
            continue
        if cur is not None:
            ins = parse_instr(line)
            if ins is not None:
                cur.append(ins)
    return comps


@dataclasses.dataclass
class Traffic:
    """Bytes read and written per execution, and where they went."""
    read: float = 0.0
    written: float = 0.0
    unknown_trip_counts: int = 0
    # (computation/instruction, what it is, bytes per execution of the program, executions)
    items: list[tuple[str, str, float, int]] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> float:
        return self.read + self.written

    def add(self, other: "Traffic", times: float = 1.0) -> None:
        self.read += other.read * times
        self.written += other.written * times
        self.unknown_trip_counts += other.unknown_trip_counts
        self.items += [(n, o, b * times, k * int(times)) for n, o, b, k in other.items]

    def top(self, n: int = 5) -> list[tuple[str, str, float, int]]:
        return sorted(self.items, key=lambda t: -t[2])[:n]


def _param_of(comp: Computation, name: str) -> Instr | None:
    ins = comp.by_name.get(name)
    if ins is None:
        return None
    while ins.opcode == "bitcast":
        ins = comp.by_name[ins.operands[0]]
    return ins if ins.opcode == "parameter" else None


def _in_place_updates(comp: Computation, root: Instr) -> list[tuple[Instr | None, int]]:
    """Per output element: (the parameter updated in place or None, bytes written)."""
    elements = ([comp.by_name[o] for o in root.operands] if root.opcode == "tuple"
                else [root])
    out = []
    for el in elements:
        hero = el
        while hero.opcode == "bitcast":
            hero = comp.by_name[hero.operands[0]]
        target = _param_of(comp, hero.operands[0]) if hero.opcode in IN_PLACE else None
        if target is not None and array_bytes(target.shape) == el.bytes:
            if hero.opcode == "dynamic-update-slice":
                update = comp.by_name[hero.operands[1]].bytes
            else:   # scatter(operands..., indices, updates...): half the rest are updates
                k = (len(hero.operands) - 1) // 2
                update = sum(comp.by_name[u].bytes for u in hero.operands[-k:])
            out.append((target, update))
        else:
            out.append((None, el.bytes))
    return out


def _param_read(comp: Computation, param: Instr, in_place: set[str]) -> int:
    """Bytes a fused computation reads of one parameter."""
    users, seen, frontier = [], set(), [param]
    while frontier:                        # look through bitcasts to the real users
        x = frontier.pop()
        for u in comp.users.get(x.name, []):
            if u.opcode == "bitcast" or (u.opcode in IN_PLACE and u.operands[0] == x.name
                                         and u.name not in in_place):
                frontier.append(u)         # a non-root update: read as its users read it
            elif u.name not in seen:
                seen.add(u.name)
                users.append((x, u))
    total = 0
    for x, u in users:
        if u.opcode in IN_PLACE and u.operands[0] == x.name and u.name in in_place:
            continue                       # the buffer updated in place: not read
        if u.opcode in SLICING and u.operands[0] == x.name:
            total += u.bytes
            continue
        return param.bytes
    return min(total, param.bytes)


def fusion_traffic(called: Computation, operand_bytes: list[int]) -> tuple[int, int]:
    """(read, written) bytes of one fusion from its fused computation `called`, given the
    bytes of the fusion's operands."""
    root = called.root
    updates = _in_place_updates(called, root)
    in_place_heroes = set()
    for el_name, (target, _) in zip(root.operands if root.opcode == "tuple" else [root.name],
                                    updates):
        if target is not None:
            hero = called.by_name[el_name]
            while hero.opcode == "bitcast":
                hero = called.by_name[hero.operands[0]]
            in_place_heroes.add(hero.name)
    read = 0
    for idx, full in enumerate(operand_bytes):
        param = called.params.get(idx)
        read += full if param is None else min(full, _param_read(called, param,
                                                                 in_place_heroes))
    return read, sum(b for _, b in updates)


def _label(ins: Instr) -> str:
    """What an instruction is, for a reader: its opcode (a fusion's kind or custom kind, a
    custom call's target) and its output shape, layouts dropped."""
    what = ins.opcode
    if ins.opcode == "fusion":
        custom = re.search(r'"custom_fusion_config":\{"name":"(\w+)"', ins.attrs)
        kind = re.search(r'"fusion_backend_config":\{"kind":"(\w+)"', ins.attrs)
        what = (f"fusion {custom.group(1)}" if custom else f"fusion {kind.group(1)}" if kind
                else f"fusion {ins.attr('kind') or ''}".strip())
        if custom and custom.group(1) == "dynamic_slice_fusion":
            what += " (a slice copy)"
    elif ins.opcode == "custom-call":
        what += f" {ins.attr('custom_call_target') or ''}".rstrip()
    shape = re.sub(r"\{[^{}]*\}", "", ins.shape)
    return f"{what} -> {shape}"


def _custom_call_outputs(ins: Instr) -> int:
    els = _elements(ins.shape)
    if len(els) > 1 and re.match(r"[su]8\[", els[-1]):
        els = els[:-1]                     # the library's workspace
    return sum(array_bytes(e) for e in els)


class Estimator:
    def __init__(self, hlo: str):
        self.comps = parse_module(hlo)
        self.entry = next(c for c in self.comps.values() if c.entry)

    def run(self) -> Traffic:
        return self.computation(self.entry)

    def computation(self, comp: Computation) -> Traffic:
        t = Traffic()
        for ins in comp.instrs:
            t.add(self.instruction(comp, ins))
        return t

    def _operand_bytes(self, comp: Computation, ins: Instr) -> list[int]:
        return [comp.by_name[o].bytes if o in comp.by_name else 0 for o in ins.operands]

    def instruction(self, comp: Computation, ins: Instr) -> Traffic:
        op = ins.opcode
        t = Traffic()
        if op in FREE or op.endswith("-done") or op == "async-update":
            return t
        if op == "while":
            body, cond = self.comps[ins.attr("body")], self.comps[ins.attr("condition")]
            m = re.search(r'"known_trip_count":\{"n":"(\d+)"', ins.attrs)
            inner = Traffic()
            inner.add(self.computation(body))
            inner.add(self.computation(cond))
            if m:
                t.add(inner, int(m.group(1)))
            else:
                t.add(inner)
                t.unknown_trip_counts += 1
            return t
        if op == "conditional":
            names = re.findall(r"%?([\w.\-]+)", (re.search(
                r"branch_computations=\{([^}]*)\}", ins.attrs) or [None, ""])[1])
            names += [n for n in (ins.attr("true_computation"), ins.attr("false_computation"))
                      if n]
            branches = [self.computation(self.comps[n]) for n in names]
            if branches:
                t.add(max(branches, key=lambda b: b.total))
            return t
        if op in ("call", "async-start") and (ins.attr("to_apply") or ins.attr("calls")):
            t.add(self.computation(self.comps[ins.attr("to_apply") or ins.attr("calls")]))
            return t
        operands = self._operand_bytes(comp, ins)
        if op == "fusion":
            read, written = fusion_traffic(self.comps[ins.attr("calls")], operands)
        elif op in ("dynamic-slice", "slice", "gather"):
            read, written = ins.bytes + sum(operands[1:]), ins.bytes
        elif op == "dynamic-update-slice":
            read, written = sum(operands[1:]), operands[1]
        elif op == "scatter":
            k = (len(operands) - 1) // 2
            read, written = sum(operands[k:]), sum(operands[-k:])
        elif op == "custom-call":
            read, written = sum(operands), _custom_call_outputs(ins)
        elif op.endswith("-start"):        # async collective/copy: its result, not the echo
            els = _elements(ins.shape)
            echo = len(ins.operands) if len(els) > len(ins.operands) else 0
            read, written = sum(operands), sum(array_bytes(e) for e in els[echo:]
                                               if not e.startswith("u32[]"))
        else:
            read, written = sum(operands), ins.bytes
        t.read, t.written = read, written
        t.items.append((f"{comp.name}/{ins.name}", _label(ins), read + written, 1))
        return t


MOVES = {"copy", "transpose", "slice", "dynamic-slice", "bitcast", "reshape"}


def _moved_parameter(comp: Computation, ins: Instr) -> bool:
    """Whether `ins` is a parameter passed through copies, transposes, slices and bitcasts
    only, with at least one op that moves data."""
    moved = False
    while ins.opcode in MOVES:
        moved |= ins.opcode not in ("bitcast", "reshape")
        ins = comp.by_name[ins.operands[0]]
    return moved and ins.opcode == "parameter"


def _held(comps: dict[str, Computation], comp: Computation, name: str) -> bool:
    """Whether value `name` of `comp` is a buffer the program holds (a parameter of its
    computation: an argument, a loop's carried state) rather than one it computed, looking
    through tuples, bitcasts and fusions that update a held buffer in place."""
    ins = comp.by_name.get(name)
    while ins is not None and ins.opcode in ("get-tuple-element", "bitcast"):
        ins = comp.by_name.get(ins.operands[0])
    if ins is None or ins.opcode == "parameter":
        return ins is not None
    if ins.opcode == "fusion" and ins.attr("calls") in comps:
        called = comps[ins.attr("calls")]
        targets = [t for t, _ in _in_place_updates(called, called.root)]
        if len(targets) == 1 and targets[0] is not None:
            return _held(comps, comp, ins.operands[targets[0].index])
    return False


def copies(hlo: str, min_bytes: int) -> list[tuple[str, str, int]]:
    """Kernels that only copy a buffer the program holds (an argument or a loop's carried
    state, such as the KV cache or the weights, not an activation), one entry per output of
    at least `min_bytes`: a copy or transpose instruction, or a fusion (any kind: a kLoop
    dynamic-slice fusion, a copy-hero `dynamic_slice_fusion`) each of whose outputs is a
    copy, transpose or (dynamic) slice of one of its operands, such as a layer's K and V
    or weights copied out of a stacked buffer. Static instructions: one in a loop body counts
    once. (computation/instruction, what, bytes of that output)."""
    comps = parse_module(hlo)
    fused = {i.attr("calls") for c in comps.values() for i in c.instrs if i.opcode == "fusion"}
    out = []
    for comp in comps.values():
        if comp.name in fused:
            continue
        for ins in comp.instrs:
            if ins.opcode in ("copy", "transpose", "copy-start"):
                sources = ins.operands[:1]
                # a copy-start's shape is (operand, result, context)
                sizes = [ins.bytes if ins.opcode != "copy-start"
                         else array_bytes(_elements(ins.shape)[1])]
            elif ins.opcode == "fusion" and ins.attr("calls") in comps:
                called = comps[ins.attr("calls")]
                root = called.root
                els = ([called.by_name[o] for o in root.operands] if root.opcode == "tuple"
                       else [root])
                if not all(_moved_parameter(called, e) for e in els):
                    continue
                sources, sizes = [], []
                for e in els:
                    while e.opcode != "parameter":
                        e = called.by_name[e.operands[0]]
                    sources.append(ins.operands[e.index])
                sizes = [e.bytes for e in els]
            else:
                continue
            out += [(f"{comp.name}/{ins.name}", _label(ins), b) for src, b in zip(
                sources * len(sizes) if len(sources) == 1 else sources, sizes)
                if b >= min_bytes and _held(comps, comp, src)]
    return out


def estimate(hlo: str) -> Traffic:
    """Kernel-boundary HBM bytes of one execution of the HLO module's entry computation."""
    return Estimator(hlo).run()


def _size(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.2f} MiB"


def by_kind(traffic: Traffic) -> list[tuple[str, float]]:
    """Bytes per kind of instruction (the label before its shape), largest first."""
    kinds: dict[str, float] = {}
    for _, what, b, _ in traffic.items:
        kinds[what.split(" -> ")[0]] = kinds.get(what.split(" -> ")[0], 0.0) + b
    return sorted(kinds.items(), key=lambda kv: -kv[1])


def describe(traffic: Traffic, n: int = 5) -> str:
    """The `n` largest instructions: computation/instruction (what, executions) bytes."""
    return "; ".join(f"{name} ({what}, x{k}) {_size(b)}" for name, what, b, k in traffic.top(n))


