"""Where a compiled step's device time goes, by model component, from a profiler trace.

`profile(step, hlo_text, steps)` runs a compiled program under `jax.profiler.trace`, reads back the
trace, and adds the time of each HLO op's executions to the model component that produced it. The
op's component is the innermost of `COMPONENTS` in its `op_name` (the jax name stack the compiled
program keeps as metadata): the model marks them with `jax.named_scope` / `jax.named_call`
(research/model, research/train/step.py). The pass: `jvp(` in the stack marks the forward,
`transpose(` the backward, and `rematted_computation` in it a forward op recomputed for the backward
(a checkpoint's); the rest is outside differentiation (the optimizer update).

Which events: on a GPU, the kernels on each `/device:` plane, named by the `hlo_op=` of the XLA
annotation they were launched under; on the CPU backend (no device plane), the host threads' XLA op
events (`hlo_op` stat). Lines derived from those (`XLA Ops`, `Steps`, ...) are skipped, and nested
events on a line (a while loop around its body's ops on the CPU) count their self time only, so
nothing is counted twice. Events of other programs (by `hlo_module`) are left out.
"""

import collections
import dataclasses
import glob
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
from jax.profiler import ProfileData

from research.optim import hlo_stats

# The scopes the model and train step set, innermost wins: 'norm' inside 'attention' is the norm.
COMPONENTS = ('embed', 'attention', 'norm', 'router', 'dispatch', 'exchange', 'experts', 'combine',
              'mlp', 'lm_head', 'loss', 'optimizer')
# 'outside': ops not under differentiation (the optimizer, metrics; all of a program with no gradient).
PASSES = ('forward', 'recompute', 'backward', 'outside')
# Lines the profiler's converters derive from the kernels (the same time again), if a trace has them.
_DERIVED = frozenset({'XLA Ops', 'XLA Modules', 'Steps', 'Framework Ops', 'Framework Name Scope',
                      'Source code', 'XLA TraceMe'})
_OP = re.compile(r'hlo_op=([^,#]+)')
_MODULE = re.compile(r'hlo_module=([^,#]+)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class OpEvent:
  """One execution of an HLO op: the op, its program (None: not said), seconds of self time."""
  hlo_op: str
  module: str | None
  seconds: float
  start_ns: float
  device: str


def _stat_op(stats: dict) -> tuple[str | None, str | None]:
  """(hlo_op, hlo_module) of an event: the CPU backend's stats, or a GPU kernel's annotation string
  (the innermost `hlo_op=` of an annotation stack like 'XlaModule:#hlo_module=m#::Thunk:#hlo_op=f#')."""
  if 'hlo_op' in stats:
    return str(stats['hlo_op']), str(stats['hlo_module']) if 'hlo_module' in stats else None
  for value in stats.values():
    if isinstance(value, str) and 'hlo_op=' in value:
      module = _MODULE.search(value)
      return _OP.findall(value)[-1], module.group(1) if module else None
  return None, None


def _self_times(events: list[tuple]) -> list[tuple]:
  """One line's events (start_ns, duration_ns, *rest) as (start_ns, self seconds, *rest): each
  event's duration less its children's (the events inside it)."""
  out, stack = [], []  # stack: (end_ns, index in out) of the open events.
  for start, dur, *rest in sorted(events, key=lambda e: (e[0], -e[1])):
    while stack and stack[-1][0] <= start:
      stack.pop()
    if stack:
      end, i = stack[-1]
      out[i][1] -= min(dur, end - start) * 1e-9
    out.append([start, dur * 1e-9, *rest])
    stack.append((start + dur, len(out) - 1))
  return [tuple(e) for e in out]


@dataclasses.dataclass(frozen=True)
class Trace:
  """A trace's HLO op executions, and what the trace held (to tell why when nothing is attributed)."""
  events: list[OpEvent]
  source: str                   # 'device' (GPU kernels) or 'host' (the CPU backend's op events).
  lines: dict[str, int]         # 'plane | line' -> events on it, for the planes read.
  unnamed: list[dict]           # The first few events that named no HLO op: name and string stats.


def op_events(data: ProfileData) -> Trace:
  """The HLO op executions on the device planes, else (the CPU backend) on the host's."""
  planes = [p for p in data.planes if p.name.startswith('/device:')]
  source = 'device'
  if not any(ev for p in planes for line in p.lines for ev in line.events):
    planes, source = [p for p in data.planes if p.name.startswith('/host:')], 'host'
  out, lines, unnamed = [], {}, []
  for plane in planes:
    for line in plane.lines:
      if line.name in _DERIVED:
        continue
      raw = [(ev.start_ns, ev.duration_ns, dict(ev.stats), ev.name) for ev in line.events]
      lines[f'{plane.name} | {line.name}'] = len(raw)
      for start, seconds, stats, name in _self_times(raw):
        op, module = _stat_op(stats)
        if op is not None:
          out.append(OpEvent(op, module, seconds, start, plane.name))
        elif len(unnamed) < 5 and source == 'device':
          unnamed.append({'name': name[:200], **{k: str(v)[:300] for k, v in stats.items()}})
  return Trace(out, source, lines, unnamed)


def op_names(hlo_text: str) -> dict[str, str]:
  """Each instruction of a compiled program's text to the op_name in its metadata. A fusion without
  one (XLA often leaves it off) takes the op_name of its fused computation's commonest component
  (XLA's own annotation takes their common prefix, which names none inside a loop)."""
  comps = hlo_stats.computations(hlo_text)
  named = {c: [m[1] for ins in instrs if (m := _OP_NAME.search(ins.line))] for c, instrs in comps.items()}
  names = {}
  for instrs in comps.values():
    for ins in instrs:
      own = _OP_NAME.search(ins.line)
      called = [n for c in ins.operands if c in named for n in named[c]]
      if own:
        names[ins.name] = own[1]
      elif called:
        votes = collections.Counter(map(classify, called))
        names[ins.name] = next(n for n in called if classify(n) == votes.most_common(1)[0][0])
  return names


def classify(op_name: str) -> tuple[str, str]:
  """(component, pass) of an op_name: the innermost scope of COMPONENTS; else 'layer_stack' for the
  layer scan's slicing (jax's dynamic_index_in_dim and dynamic_update_index_in_dim), 'unnamed' for
  an op with no op_name (copies and converts XLA adds), or 'other'."""
  if not op_name:
    return 'unnamed', 'outside'
  scopes = [t for t in re.split(r'[/();]', op_name) if t in COMPONENTS]
  if not scopes and 'index_in_dim' in op_name:  # A layer's slice of the stacked params, or its grads' write.
    scopes = ['layer_stack']
  if 'transpose(' in op_name:
    which = 'recompute' if 'rematted_computation' in op_name else 'backward'
  else:
    which = 'forward' if 'jvp(' in op_name else 'outside'
  return (scopes[-1] if scopes else 'other'), which


@dataclasses.dataclass(frozen=True)
class Profile:
  """Device seconds per step of one program, by component and pass, and its costliest ops."""
  steps: int
  source: str                   # Trace.source.
  wall_seconds: float           # Per step, the traced steps' wall clock.
  op_seconds: float             # Per step, the sum of the program's op events (all streams, threads).
  busy_seconds: float           # Per step, the union of the op events' intervals (device busy).
  components: dict[str, dict[str, float]]  # component -> pass -> seconds per step.
  launches: dict[str, float]    # component -> op executions (kernels, on a GPU) per step.
  top_ops: list[dict]           # The ops with the most seconds: hlo_op, op_name, component, pass, seconds.
  lines: dict[str, int]         # Trace.lines.
  unnamed: list[dict]           # Trace.unnamed.

  def table(self) -> str:
    """Markdown: a row per component: ms per step by pass, share of op time, launches per step."""
    lines = ['| component | ' + ' | '.join(f'{p} ms' for p in PASSES) + ' | share | launches |',
             '|---|' + '---:|' * (len(PASSES) + 2)]
    for name, by_pass in sorted(self.components.items(), key=lambda kv: -sum(kv[1].values())):
      total = sum(by_pass.values())
      cells = [f'{1e3 * by_pass.get(p, 0.0):.3f}' for p in PASSES]
      lines.append(f'| {name} | ' + ' | '.join(cells) +
                   f' | {total / max(self.op_seconds, 1e-30):.3f} | {self.launches.get(name, 0):.0f} |')
    return '\n'.join(lines)


def _union(intervals: list[tuple[float, float]]) -> float:
  total, end = 0.0, float('-inf')
  for s, e in sorted(intervals):
    if e > end:
      total += e - max(s, end)
      end = e
  return total


def attribute(trace: Trace, names: dict[str, str], module: str | None, steps: int, wall_seconds: float,
              top: int = 15) -> Profile:
  """Adds the trace's events of `module` (and those that name none) to their components; per step."""
  mine = [e for e in trace.events if e.module is None or module is None or e.module == module]
  per_op, calls, by_device = collections.Counter(), collections.Counter(), collections.defaultdict(list)
  for e in mine:
    per_op[e.hlo_op] += e.seconds / steps
    calls[e.hlo_op] += 1 / steps
    by_device[e.device].append((e.start_ns * 1e-9, e.start_ns * 1e-9 + e.seconds))
  kind = {op: classify(names.get(op, '')) for op in per_op}  # (component, pass) of each op.
  components = collections.defaultdict(lambda: collections.defaultdict(float))
  launches = collections.Counter()
  for op, s in per_op.items():
    components[kind[op][0]][kind[op][1]] += s
    launches[kind[op][0]] += calls[op]
  top_ops = [dict(hlo_op=op, op_name=names.get(op, ''), seconds=s, component=kind[op][0], **{'pass': kind[op][1]})
             for op, s in per_op.most_common(top)]
  return Profile(steps=steps, source=trace.source, wall_seconds=wall_seconds / steps,
                 op_seconds=sum(per_op.values()),
                 busy_seconds=max((_union(v) for v in by_device.values()), default=0.0) / steps,
                 components={k: dict(v) for k, v in components.items()}, launches=dict(launches), top_ops=top_ops,
                 lines=trace.lines, unnamed=trace.unnamed)


def profile(step: Callable[[], Any], hlo_text: str, steps: int = 3) -> Profile:
  """Runs `step()` (one execution of the compiled program whose text is `hlo_text`, blocking until it
  is done) `steps` times under the profiler and attributes that program's device time."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      t0 = time.perf_counter()
      for _ in range(steps):
        step()
      wall = time.perf_counter() - t0
    return read(d, hlo_text, steps, wall)


def read(log_dir: str, hlo_text: str, steps: int, wall_seconds: float) -> Profile:
  """The profile of `steps` runs of the program `hlo_text` from the newest trace that
  `jax.profiler.trace(log_dir)` (or start_trace) wrote."""
  found = sorted(glob.glob(os.path.join(log_dir, 'plugins', 'profile', '*', '*.xplane.pb')), key=os.path.getmtime)
  if not found:
    raise FileNotFoundError(f'the profiler wrote no plugins/profile/*/*.xplane.pb under {log_dir}')
  module = re.match(r'HloModule ([\w.\-]+)', hlo_text)
  return attribute(op_events(ProfileData.from_file(found[-1])), op_names(hlo_text),
                   module.group(1) if module else None, steps, wall_seconds)
