"""Critics: find the wrong step of a finished trajectory and write the hint for it.

A rule maps a trajectory to zero or more `Feedback(message, hint, rule, version)`: the index of the
target model message and the text to insert before it; `fb.tag` is 'rule@version'. A message gets at
most one hint (the first rule in the config's list that claims it), so per-rule statistics attribute
each distillation target to one rule. Rules read what the environment made of each message
(`Message.info`), never re-parse the tokens.

Rules are versioned; each environment registers its own (research/rl/envs/toolcalc.py,
research/rl/envs/repo/rules.py). Writing one:
  * as data: `register(Template(RuleSpec(id, version, when, hint)))`: it fires on a message whose info
    has every item of `when` (a value `True` asks only that the key be truthy), and its hint is
    `hint.format(**info)`. `RuleSpec.from_json` reads one from a config string.
  * as code: a `Rule` subclass with `name`, `version` and `hint(info, traj, i)`.
Changing what a rule says or when it fires means a new version: `revise(id, hint=...)` registers
version + 1 (the registry refuses a second, different id@version), and the metrics and hints of a
run carry the version. `REGISTRY[id]` is the newest version; `VERSIONS` keeps every one.
`JudgeCritic` is the interface for a model-based critic: any callable from a prompt to a reply.
"""

import dataclasses
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence

from research import configs
from research.rl.rollout.trajectory import Trajectory


@dataclasses.dataclass(frozen=True)
class Feedback:
  message: int                      # Index into trajectory.messages.
  hint: str
  rule: str
  version: int = 1

  @property
  def tag(self) -> str:
    return f'{self.rule}@{self.version}'


class Rule:
  name: str = ''
  version: int = 1

  def __call__(self, traj: Trajectory) -> list[Feedback]:
    return [Feedback(i, h, self.name, self.version) for i, m in enumerate(traj.messages)
            if (h := self.hint(m.info, traj, i)) is not None]

  def hint(self, info: dict, traj: Trajectory, i: int) -> str | None:
    raise NotImplementedError

  def content(self) -> str:
    """What a version pins (a data rule's trigger and text; a code rule's class)."""
    return type(self).__qualname__


REGISTRY: dict[str, Rule] = {}
VERSIONS: dict[str, Rule] = {}      # 'id@version' -> rule, every version ever registered.


def register(rule: Rule) -> Rule:
  """Adds a rule; a known id needs a higher version (which becomes REGISTRY's) or the same content."""
  tag = f'{rule.name}@{rule.version}'
  if not rule.name or rule.version < 1:
    raise ValueError(f'rule {type(rule).__name__}: needs a name and a version >= 1, got {tag!r}')
  old = REGISTRY.get(rule.name)
  if tag in VERSIONS or (old is not None and old.version >= rule.version):
    same = tag in VERSIONS and VERSIONS[tag].content() == rule.content()
    raise ValueError(f'rule {tag}: ' + ('already registered' if same else
                     f'{rule.name}@{old.version} exists; a changed rule needs a higher version'))
  REGISTRY[rule.name] = VERSIONS[tag] = rule
  return rule


class OnInfo(Rule):
  """Claims a message whose `info` satisfies `when`; the hint is `say(info)`."""

  def __init__(self, name: str, when: Callable[[dict], object], say: Callable[[dict], str], version: int = 1):
    self.name, self.when, self.say, self.version = name, when, say, version

  def hint(self, info, traj, i):
    return self.say(info) if self.when(info) else None


@dataclasses.dataclass(frozen=True)
class RuleSpec:
  """A rule as data: id, version, trigger (info items a message must have) and hint template."""
  id: str
  version: int
  when: Mapping[str, object]
  hint: str

  @classmethod
  def from_json(cls, text: str) -> 'RuleSpec':
    """'{"id": .., "version": .., "when": {..}, "hint": ..}' (other keys are the caller's)."""
    d = json.loads(text)
    missing = [k for k in ('id', 'version', 'when', 'hint') if k not in d]
    if missing or not isinstance(d['when'], dict) or not d['when']:
      raise ValueError(f'rule spec {text!r}: needs id, version, a non-empty when and hint; missing {missing}')
    return cls(str(d['id']), int(d['version']), dict(d['when']), str(d['hint']))


class Template(Rule):
  """The rule a RuleSpec describes."""

  def __init__(self, spec: RuleSpec):
    self.spec, self.name, self.version = spec, spec.id, spec.version

  def hint(self, info, traj, i):
    hit = all(info.get(k) if v is True else info.get(k) == v for k, v in self.spec.when.items())
    return self.spec.hint.format(**info) if hit else None

  def content(self) -> str:
    return json.dumps([dict(self.spec.when), self.spec.hint], sort_keys=True)


def revise(rule_id: str, *, hint: str | None = None, when: Mapping[str, object] | None = None) -> Template:
  """A data rule's next version, with a new text and/or trigger (registered, and REGISTRY's from now)."""
  old = REGISTRY[rule_id]
  if not isinstance(old, Template):
    raise ValueError(f'rule {rule_id!r} is code ({type(old).__name__}); revise its class and version')
  spec = old.spec
  return register(Template(RuleSpec(rule_id, spec.version + 1, spec.when if when is None else when,
                                    spec.hint if hint is None else hint)))


class Critic:
  """The rules of a config, applied in order; one hint per message."""

  def __init__(self, rules: Sequence[Rule | str]):
    unknown = [r for r in rules if isinstance(r, str) and r not in REGISTRY]
    if unknown:
      raise ValueError(f'critic rules {unknown} are not registered; known: {sorted(REGISTRY)}')
    self.rules = [REGISTRY[r] if isinstance(r, str) else r for r in rules]

  @property
  def names(self) -> list[str]:
    return [r.name for r in self.rules]

  def __call__(self, traj: Trajectory, skip: Collection[str] = ()) -> list[Feedback]:
    """The hints of every rule whose tag ('rule@version') is not in `skip` (suspended ones)."""
    if traj.fault is not None:
      return []
    out, taken = [], set()
    for rule in self.rules:
      if f'{rule.name}@{rule.version}' in skip:
        continue
      for fb in rule(traj):
        if fb.message not in taken and 0 <= fb.message < len(traj.messages):
          taken.add(fb.message)
          out.append(fb)
    return sorted(out, key=lambda f: f.message)


@dataclasses.dataclass(frozen=True)
class CriticConfig:
  """critic: the rules that write hints."""
  rules: tuple[str, ...] = ('unknown_tool', 'wrong_tool')  # Registered rule names, in priority order.

  def validate(self, path: str = 'critic.') -> 'CriticConfig':
    unknown = [r for r in self.rules if r not in REGISTRY]
    if unknown:
      raise configs.invalid(path + 'rules', self.rules, f'{unknown} not registered; known: {sorted(REGISTRY)}')
    return self


class JudgeCritic(Rule):
  """A model-based critic: renders the transcript, asks `judge` (prompt -> reply), parses the hints.

  The reply has one line `message N: hint` per target (N counts model messages from 0) or `none`.
  Unparseable lines, out-of-range indices and a judge that raises yield no feedback and are counted
  in `self.errors`.
  """
  name = 'judge'
  _LINE = re.compile(r'^\s*message\s+(\d+)\s*:\s*(.+?)\s*$', re.I)

  def __init__(self, judge: Callable[[str], str], max_hint_chars: int = 160):
    self.judge, self.max_hint_chars, self.errors = judge, max_hint_chars, 0

  def prompt(self, traj: Trajectory) -> str:
    lines = [f'[{m["role"]}] {m["content"]}' for m in traj.prompt]
    k = 0
    for role, text in traj.transcript:
      if role == 'assistant':
        lines.append(f'[model message {k}] {text}')
        k += 1
      else:
        lines.append(f'[{role}] {text}')
    return ('Find the model messages that went wrong and write a short hint for each.\n'
            + '\n'.join(lines) + '\nReply with lines "message N: hint", or "none".')

  def __call__(self, traj: Trajectory) -> list[Feedback]:
    try:
      reply = self.judge(self.prompt(traj))
    except Exception:  # noqa: BLE001 - a failing judge gives no feedback, never a crash.
      self.errors += 1
      return []
    out = []
    for line in str(reply).splitlines():
      if not line.strip() or line.strip().lower() == 'none':
        continue
      m = self._LINE.match(line)
      if m is None or int(m.group(1)) >= len(traj.messages):
        self.errors += 1
        continue
      out.append(Feedback(int(m.group(1)), m.group(2)[:self.max_hint_chars], self.name, self.version))
    return out
