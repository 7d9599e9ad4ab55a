"""What a compiled program communicates and how it schedules it, read from HLO text.

Bytes are what one device sends, the convention research/optim/plan.py predicts:
all-to-all and all-gather (G devices, result R bytes): R (G-1)/G; reduce-scatter: R (G-1);
all-reduce: 2 R (G-1)/G; collective-permute: R. Async pairs count once, at their `-done`.
Works on `compiled.as_text()` and on `lowered.as_text(dialect='hlo')` (before backend passes:
XLA:CPU widens bf16 collectives to f32, so a bf16 exchange shows its width only there), and on
XLA:GPU's programs, whose matmuls are gemm fusions or cuBLAS/cuDNN custom-calls.
"""

import dataclasses
import math
import re

import numpy as np

COLLECTIVES = ('all-to-all', 'ragged-all-to-all', 'all-gather', 'all-reduce', 'reduce-scatter',
               'collective-permute')
_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'f8e4m3fn': 1, 'f8e5m2': 1, 's16': 2, 'u16': 2, 'f16': 2,
          'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8,
          'c128': 16}
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?(?P<name>[\w.-]+)\s*=\s*')
_HEADER = re.compile(r'^(?:ENTRY\s+)?%?(?P<name>[\w.-]+)\s.*\{\s*$')
_ARRAY = re.compile(r'\b([a-z]+\d*(?:e\d+m\d+(?:fn)?)?)\[([\d,]*)\]')


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  opcode: str
  result_bytes: int
  operands: tuple[str, ...]   # Names of instructions and computations it references.
  line: str


def _shape_bytes(shape: str) -> int:
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    n = 1
    for d in filter(None, dims.split(',')):
      n *= int(d)
    total += n * _BYTES.get(dtype, 0)
  return total


def _split_paren(s: str) -> tuple[str, str]:
  """(inside, after) for `s` that follows an opening parenthesis."""
  depth = 1
  for i, ch in enumerate(s):
    depth += (ch == '(') - (ch == ')')
    if not depth:
      return s[:i], s[i + 1:]
  return s, ''


def _parse(line: str) -> Instruction | None:
  m = _INSTR.match(line)
  if not m:
    return None
  rest = line[m.end():]
  if rest.startswith('('):  # A tuple shape.
    shape, rest = _split_paren(rest[1:])
    rest = rest.lstrip()
  else:
    shape, _, rest = rest.partition(' ')
  opcode, _, rest = rest.partition('(')
  args, attrs = _split_paren(rest)
  operands = re.findall(r'%?([A-Za-z_][\w.-]*)', re.sub(r'\w+\[[\d,]*\](\{[\d,]*\})?', '', args))
  operands += re.findall(r'(?:calls|to_apply)=%?([\w.-]+)', attrs)
  return Instruction(m['name'], opcode, _shape_bytes(shape), tuple(operands), line)


def computations(hlo: str) -> dict[str, list[Instruction]]:
  """Instructions of every computation, in schedule order; the entry is also under 'ENTRY'."""
  out, current = {}, None
  for line in hlo.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m and not line.startswith('HloModule'):
        current = out.setdefault(m['name'], [])
        if line.startswith('ENTRY'):
          out['ENTRY'] = current
    elif line.startswith('}'):
      current = None
    else:
      ins = _parse(line)
      if ins:
        current.append(ins)
  return out


def _group_size(line: str) -> int:
  m = re.search(r'replica_groups=\[(\d+),(\d+)\]', line)
  if m:
    return int(m[2])
  m = re.search(r'replica_groups=\{\{([\d,]*)\}', line)
  if m:
    return len(m[1].split(','))
  return 2 if 'source_target_pairs=' in line else 1


def _sent(kind: str, group: int, result: int) -> float:
  if kind == 'reduce-scatter':
    return result * (group - 1)
  if kind == 'all-reduce':
    return 2 * result * (group - 1) / group
  if kind == 'collective-permute':
    return result
  return result * (group - 1) / group


def collective_ops(hlo: str) -> dict[str, int]:
  """Collectives by opcode over all computations (an async pair counts once, as `<op>-start`)."""
  out = {}
  for name, instrs in computations(hlo).items():
    for ins in instrs if name != 'ENTRY' else ():
      if ins.opcode.removesuffix('-start') in COLLECTIVES:
        out[ins.opcode] = out.get(ins.opcode, 0) + 1
  return out


def _collectives(hlo: str):
  """(kind, line naming the groups, bytes one device sends) of every collective but
  ragged-all-to-all: what that sends depends on the data (its static shape is the worst case)."""
  for name, instrs in computations(hlo).items():
    if name == 'ENTRY':
      continue
    by_name = {ins.name: ins for ins in instrs}
    for ins in instrs:
      kind = ins.opcode.removesuffix('-done')
      if kind in COLLECTIVES and kind != 'ragged-all-to-all' and not ins.opcode.endswith('-start'):
        # A `-done` names its groups only through its `-start` (XLA:GPU prints them there).
        start = by_name.get(ins.operands[0]) if ins.opcode.endswith('-done') else None
        line = (start or ins).line
        yield kind, line, _sent(kind, _group_size(line), ins.result_bytes)


def collective_bytes(hlo: str) -> float:
  """Bytes one device sends in all collectives of the program."""
  return sum((sent for _, _, sent in _collectives(hlo)), 0.0)


def replica_groups(line: str) -> list[list[int]] | None:
  """Device groups of a collective: `{{0,1},{2,3}}`, or the iota form `[G,S]<=[dims]T(perm)`
  (iota over dims, transposed by perm, reshaped to G groups of S); a permute's source-target pairs."""
  m = re.search(r'replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?', line)
  if m:
    dims = [int(d) for d in m[3].split(',')]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m[4]:
      ids = ids.transpose([int(p) for p in m[4].split(',')])
    return ids.reshape(int(m[1]), int(m[2])).tolist()
  m = re.search(r'(?:replica_groups|source_target_pairs)=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}', line)
  if m:
    return [[int(d) for d in g.split(',') if d] for g in re.findall(r'\{([\d,]*)\}', m[1])]
  return None


def collective_bytes_by_link(hlo: str, devices_per_node: int, device: int = 0) -> dict[str, float]:
  """Bytes `device` sends to devices on its own node ('intra') and on others ('inter'), devices
  numbered as the mesh flattens them (node = id // devices_per_node); each collective's bytes are
  split evenly over the peers of `device`'s group."""
  out = {'intra': 0.0, 'inter': 0.0}
  for _, line, sent in _collectives(hlo):
    group = next((g for g in replica_groups(line) or () if device in g), None)
    if not group or len(group) < 2:
      continue
    intra = sum(d // devices_per_node == device // devices_per_node for d in group) - 1
    out['intra'] += sent * intra / (len(group) - 1)
    out['inter'] += sent * (len(group) - 1 - intra) / (len(group) - 1)
  return out


def _dims(line: str) -> list[int]:
  """Dimensions of an instruction's (first) result array."""
  m = _ARRAY.search(line.split('=', 1)[1])
  return [int(d) for d in m[2].split(',') if d] if m else []


def matmul_flops(hlo: str) -> float:
  """2 x result elements x contracted extent, over the dots of every computation (each counted
  once, so for programs without loops: NS unrolls its steps)."""
  total = 0.0
  for name, instrs in computations(hlo).items():
    if name == 'ENTRY':
      continue
    by_name = {ins.name: ins for ins in instrs}
    for ins in instrs:
      if ins.opcode == 'dot':
        lhs = _dims(by_name[ins.operands[0]].line)
        contracting = re.search(r'lhs_contracting_dims=\{([\d,]*)\}', ins.line)[1]
        k = math.prod(lhs[int(c)] for c in contracting.split(',') if c)
        total += 2 * math.prod(_dims(ins.line)) * k
  return total


_LIBRARY_MATMUL = re.compile(r'custom_call_target="__(?:cublas|cudnn)\$')


def _is_matmul(ins: Instruction, comps: dict[str, list[Instruction]]) -> bool:
  if ins.opcode in ('dot', 'convolution'):
    return True
  if ins.opcode == 'custom-call':  # XLA:GPU's library calls: __cublas$gemm, __cublas$lt$matmul.
    return bool(_LIBRARY_MATMUL.search(ins.line))
  return ins.opcode == 'fusion' and any(
      c.opcode in ('dot', 'convolution') for op in ins.operands for c in comps.get(op, ()))


def _is_collective(ins: Instruction, comps: dict[str, list[Instruction]]) -> bool:
  if ins.opcode.removesuffix('-start') in COLLECTIVES:
    return True
  return ins.opcode == 'async-start' and any(
      c.opcode in COLLECTIVES for op in ins.operands for c in comps.get(op, ()))


def schedule(hlo: str) -> dict[str, int]:
  """How the entry computation orders collectives and matmuls.

  collectives: collectives (async starts count once); async: those split into start/done that
  the backend did not mark synchronous (XLA:GPU's `"is_sync":true`);
  async_overlapped: async pairs with at least one matmul scheduled between start and done;
  matmuls_in_flight: matmuls scheduled while an async collective is in flight;
  interleaved: collectives scheduled between the first and the last matmul;
  max_collective_deps: most collectives any collective transitively waits for (chunks whose
  exchanges wait only on their own earlier exchange can overlap each other's NS).
  """
  comps = computations(hlo)
  entry = comps.get('ENTRY', [])
  names = {ins.name for ins in entry}
  deps: dict[str, set[str]] = {}
  is_coll = {ins.name: _is_collective(ins, comps) for ins in entry}
  for ins in entry:
    d = set()
    for op in ins.operands:
      if op in names:
        d |= deps.get(op, set()) | ({op} if is_coll.get(op) else set())
    deps[ins.name] = d
  matmul_pos = [i for i, ins in enumerate(entry) if _is_matmul(ins, comps)]
  colls = [(i, ins) for i, ins in enumerate(entry) if is_coll[ins.name]]
  starts = {ins.name: i for i, ins in colls
            if ins.opcode.endswith('-start') and '"is_sync":true' not in ins.line}
  in_flight, overlapped, open_starts = 0, 0, set()
  for i, ins in enumerate(entry):
    if ins.name in starts:
      open_starts.add(ins.name)
    elif ins.opcode.endswith('-done') and ins.operands and ins.operands[0] in open_starts:
      open_starts.discard(ins.operands[0])
      overlapped += any(starts[ins.operands[0]] < p < i for p in matmul_pos)
    elif open_starts and _is_matmul(ins, comps):
      in_flight += 1
  first, last = (matmul_pos[0], matmul_pos[-1]) if matmul_pos else (0, -1)
  return {
      'collectives': len(colls),
      'async': len(starts),
      'async_overlapped': overlapped,
      'matmuls': len(matmul_pos),
      'matmuls_in_flight': in_flight,
      'interleaved': sum(first < i < last for i, _ in colls),
      'max_collective_deps': max((len(deps[ins.name]) for _, ins in colls), default=0),
  }
