"""Governed feedback: hints measured per rule@version, harmful ones suspended, drift noticed.

    gov = Governance(config.governance, critic, workdir, prober)   # research/rl/loop.py's Runner
    feedback, every = gov.critique(step, trajs)   # the active rules' hints, and every rule's
    row = gov.step(step, trajs, valid, every, params, teacher_params, key)  # probes, decisions, drift

Rules are versioned (research/rl/feedback/critics.py says how to write one, as data or as code). Each step:
  1. Efficacy. For up to `probes_per_step` hinted positions (spread over the rules; a suspended
     rule's at most once every `retest_every` steps), the prober re-samples `k` continuations from
     the prefix with the hint and `k` without (by the teacher's weights: its hinted distribution is
     what is distilled); the difference in success (of the continuation: what
     the prefix cost is forgiven) is one probe of that rule@version, with the teacher's log-prob
     gain on the corrected token. The estimate is the mean of the last `window` probes with a
     normal interval (mean +- z * standard error).
  2. Governance. An active rule whose interval lies below zero (after `min_probes`) is suspended: no
     hints, so no distillation from it; its window restarts, and the re-tests reinstate it when the
     interval lies above zero. Every decision goes to workdir/governance.jsonl with its evidence.
  3. Drift. Failed episodes where no rule fired are grouped by `signature` (error, tool, message with
     numbers blanked); a Page-Hinkley test on each signature's rate per step flags a rise (`drift`
     events, with example transcripts): a candidate for a new rule. `new_rules` register a rule at a
     given step, standing for a person's response.
Both calls run on the loop's main thread, in step order; what one step's critique found reaches
`step` as an argument (the loop's Rollouts carry it), never as state. No JAX here: the prober
(probe.py) does the sampling.
"""

import collections
import dataclasses
import json
import math
import os
import re

import numpy as np

from research import configs
from research.rl.feedback import critics
from research.rl.rollout.trajectory import Trajectory


@dataclasses.dataclass(frozen=True)
class GovernanceConfig:
  """governance: online efficacy per rule@version, suspension and reinstatement, drift detection."""
  enabled: bool = False             # Off: the critic's hints as they are (new_rules still apply).
  probes_per_step: int = 4          # Hinted positions re-sampled per step.
  k: int = 4                        # Continuations per probe, with the hint and without (each).
  window: int = 12                  # Probes per rule@version in the running estimate.
  min_probes: int = 4               # Probes before a rule can be suspended or reinstated.
  z: float = 1.645                  # Interval half-width in standard errors (90% two-sided).
  retest_every: int = 3             # A suspended rule is probed at most once every this many steps.
  drift_delta: float = 0.02         # Page-Hinkley: rate change tolerated per step.
  drift_lambda: float = 0.15        # Page-Hinkley: cumulative rise that flags drift.
  drift_min_count: int = 3          # Failures of a signature in the step that flags it.
  new_rules: tuple[str, ...] = ()   # JSON RuleSpecs with "at": the RL step they are registered at.

  def validate(self, path: str = 'governance.') -> 'GovernanceConfig':
    for f, low in (('probes_per_step', 1), ('k', 1), ('window', 2), ('min_probes', 2), ('retest_every', 1),
                   ('drift_min_count', 1)):
      if getattr(self, f) < low:
        raise configs.invalid(path + f, getattr(self, f), f'must be >= {low}')
    for f in ('z', 'drift_delta', 'drift_lambda'):
      if getattr(self, f) < 0:
        raise configs.invalid(path + f, getattr(self, f), 'must be >= 0')
    for spec in self.new_rules:
      try:
        at, _ = parse_new_rule(spec)
      except ValueError as e:
        raise configs.invalid(path + 'new_rules', spec, str(e)) from None
      if at < 1:
        raise configs.invalid(path + 'new_rules', spec, '"at" must be an RL step >= 1')
    return self


def parse_new_rule(text: str) -> tuple[int, critics.RuleSpec]:
  """A `new_rules` entry: (the step it is registered at, the rule)."""
  d = json.loads(text)
  if 'at' not in d:
    raise ValueError(f'new rule {text!r}: needs "at", the RL step to register it at')
  return int(d['at']), critics.RuleSpec.from_json(text)


@dataclasses.dataclass(frozen=True)
class Probe:
  """One measured hint: success with and without it from the same prefix (k continuations each)."""
  tag: str                          # 'rule@version'.
  hinted: float                     # Success rate of the continuations with the hint.
  plain: float                      # ... and without it.
  gain: float                       # Teacher log p(corrected token | hint) - student log p(it | no hint).

  @property
  def diff(self) -> float:
    return self.hinted - self.plain


@dataclasses.dataclass(frozen=True)
class Estimate:
  n: int
  mean: float
  lo: float
  hi: float
  gain: float


def estimate(probes: list[Probe], z: float) -> Estimate:
  """Mean difference with a normal interval; fewer than 2 probes: an interval of +-inf."""
  d = np.array([p.diff for p in probes], float)
  gain = float(np.nanmean([p.gain for p in probes])) if probes else math.nan
  if len(d) < 2:
    return Estimate(len(d), float(d.mean()) if len(d) else math.nan, -math.inf, math.inf, gain)
  half = z * float(d.std(ddof=1)) / math.sqrt(len(d))
  return Estimate(len(d), float(d.mean()), float(d.mean()) - half, float(d.mean()) + half, gain)


class PageHinkley:
  """Page-Hinkley test for a rise in a rate observed once per step."""

  def __init__(self, delta: float, lam: float, seen_steps: int = 0):
    self.delta, self.lam = delta, lam
    self.n, self.mean, self.m = seen_steps, 0.0, 0.0  # Steps before the first sight counted as 0.
    self.m_min = 0.0

  def update(self, x: float) -> bool:
    """Adds one step's rate; True when the cumulative rise over the running mean passes lambda."""
    self.n += 1
    self.mean += (x - self.mean) / self.n
    self.m += x - self.mean - self.delta
    self.m_min = min(self.m_min, self.m)
    return self.m - self.m_min > self.lam

  def reset(self):
    self.n, self.mean, self.m, self.m_min = 0, 0.0, 0.0, 0.0


_NUMBER = re.compile(r'-?\d+')


def signature(traj: Trajectory) -> str:
  """'error|tool|message' of the first message the environment objected to (numbers blanked to #);
  without one, the end of the grade (toolcalc: 'answer # wrong ...')."""
  for m in traj.messages:
    info = m.info
    error = info.get('error_type') or info.get('error') or ('wrong_op' if info.get('wrong_op') else '')
    if error:
      tool = info.get('name') or info.get('tool') or ''
      return f'{error}|{tool}|{_NUMBER.sub("#", m.text.strip())[:60]}'
  last = traj.messages[-1].info if traj.messages else {}
  return 'no_error|' + _NUMBER.sub('#', str(last.get('grade') or last.get('kind') or 'none'))[:60]


class Governance:
  """The rules' states, their efficacy estimates, the drift tests and the decision log of one run."""

  def __init__(self, c: GovernanceConfig, critic: critics.Critic, workdir: str, prober=None):
    self.c, self.critic, self.prober = c, critic, prober
    self.log_path = os.path.join(workdir, 'governance.jsonl')
    self.probes: dict[str, collections.deque] = {}
    self.suspended: set[str] = set()
    self.last_retest: dict[str, int] = {}
    self.drift: dict[str, PageHinkley] = {}
    self.events: list[dict] = []
    self.pending = sorted((parse_new_rule(s) for s in c.new_rules), key=lambda x: x[0])

  # ------------------------------------------------------------------------------------------
  def critique(self, step: int, trajs: list[Trajectory]
               ) -> tuple[list[tuple[int, critics.Feedback]], list[tuple[int, critics.Feedback]]]:
    """Registers the new rules due by `step`; then (the active rules' feedback, every rule's), by
    rollout index. Governance probes suspended rules too: `step` takes the second."""
    while self.pending and self.pending[0][0] <= step:
      at, spec = self.pending.pop(0)
      rule = critics.VERSIONS.get(f'{spec.id}@{spec.version}') or critics.register(critics.Template(spec))
      self.critic.rules = [r for r in self.critic.rules if r.name != spec.id] + [rule]
      self._decide(step, rule.name + f'@{rule.version}', 'registered', {'at': at, 'when': dict(spec.when),
                                                                         'hint': spec.hint})
    every = [(i, fb) for i, t in enumerate(trajs) for fb in self.critic(t)]
    return [(i, fb) for i, fb in every if fb.tag not in self.suspended], every

  def step(self, step: int, trajs: list[Trajectory], valid: np.ndarray,
           feedback: list[tuple[int, critics.Feedback]], params=None, teacher_params=None,
           key=None) -> dict[str, float]:
    """Probes this step's hints (`feedback`: every rule's, from `critique`), decides, tests for
    drift. Returns the step's metrics."""
    if not self.c.enabled:
      return {}
    chosen = self.choose(step, feedback, np.random.default_rng([step, 7]))
    if chosen and self.prober is not None:
      for p in self.prober(params, teacher_params, trajs, chosen, key):
        self.probes.setdefault(p.tag, collections.deque(maxlen=self.c.window)).append(p)
    self._govern(step)
    return {**self._detect(step, trajs, valid, feedback), **self.row(feedback)}

  def choose(self, step: int, feedback, rng: np.random.Generator) -> list[tuple[int, critics.Feedback]]:
    """Up to probes_per_step hinted positions, round-robin over the rules (suspended ones only when a
    re-test is due, one position each)."""
    by_tag: dict[str, list] = {}
    for i, fb in feedback:
      by_tag.setdefault(fb.tag, []).append((i, fb))
    for tag in [t for t in by_tag if t in self.suspended]:
      if step - self.last_retest.get(tag, -self.c.retest_every) < self.c.retest_every:
        del by_tag[tag]
      else:
        self.last_retest[tag] = step
        by_tag[tag] = by_tag[tag][:1]
    pools = [list(rng.permutation(len(v))) for v in by_tag.values()]
    out = []
    while len(out) < self.c.probes_per_step and any(pools):
      for pool, items in zip(pools, by_tag.values()):
        if pool and len(out) < self.c.probes_per_step:
          out.append(items[pool.pop()])
    return out

  # ------------------------------------------------------------------------------------------
  def _govern(self, step: int):
    """Suspends an active rule whose interval lies below 0; reinstates a suspended one above 0."""
    for tag, probes in self.probes.items():
      e = estimate(list(probes), self.c.z)
      if e.n < self.c.min_probes:
        continue
      evidence = {**dataclasses.asdict(e), 'diffs': [p.diff for p in probes]}
      if tag not in self.suspended and e.hi < 0:
        self.suspended.add(tag)
        self.last_retest[tag] = step
        probes.clear()  # Reinstatement is judged on re-tests alone.
        self._decide(step, tag, 'suspended', evidence)
      elif tag in self.suspended and e.lo > 0:
        self.suspended.discard(tag)
        self._decide(step, tag, 'reinstated', evidence)

  def _detect(self, step: int, trajs: list[Trajectory], valid: np.ndarray,
              feedback: list[tuple[int, critics.Feedback]]) -> dict[str, float]:
    """Page-Hinkley on the rate of each signature of unexplained failures (no rule fired)."""
    explained = {i for i, _ in feedback}
    groups: dict[str, list[Trajectory]] = {}
    for i, t in enumerate(trajs):
      if valid[i] and not t.success and i not in explained:
        groups.setdefault(signature(t), []).append(t)
    n = max(int(valid.sum()), 1)
    for sig in groups:
      self.drift.setdefault(sig, PageHinkley(self.c.drift_delta, self.c.drift_lambda, seen_steps=step - 1))
    for sig, test in self.drift.items():
      hits = groups.get(sig, [])
      if test.update(len(hits) / n) and len(hits) >= self.c.drift_min_count:
        test.reset()
        event = {'step': step, 'signature': sig, 'rate': len(hits) / n,
                 'examples': [t.transcript for t in hits[:3]]}
        self.events.append(event)
        self._write({'kind': 'drift', **event})
    return {'unexplained_failures': sum(len(v) for v in groups.values()) / n, 'drift_events': len(self.events)}

  def _decide(self, step: int, tag: str, decision: str, evidence: dict):
    self._write({'kind': 'decision', 'step': step, 'rule': tag, 'decision': decision, 'evidence': evidence})

  def _write(self, record: dict):
    with open(self.log_path, 'a') as f:
      f.write(json.dumps(record, default=float) + '\n')

  def row(self, feedback: list[tuple[int, critics.Feedback]]) -> dict[str, float]:
    """Per rule@version: firings this step (`feedback`), probes, efficacy and interval, gain,
    active (1/0)."""
    fired = collections.Counter(fb.tag for _, fb in feedback)
    out = {}
    for tag in sorted(set(fired) | set(self.probes) | self.suspended):
      e = estimate(list(self.probes.get(tag, ())), self.c.z)
      out.update({f'gov/{tag}/fires': fired[tag], f'gov/{tag}/probes': e.n, f'gov/{tag}/efficacy': e.mean,
                  f'gov/{tag}/lo': e.lo, f'gov/{tag}/hi': e.hi, f'gov/{tag}/gain': e.gain,
                  f'gov/{tag}/active': float(tag not in self.suspended)})
    return out
