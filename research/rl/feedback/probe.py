"""Efficacy probes of hints: re-sample from a hinted position's prefix with and without the hint.

`Prober(...)(params, teacher_params, trajs, positions, key)` -> one governance.Probe per position.
A position (rollout index, Feedback) is replayed: a fresh episode of the same task is stepped
through the model messages before the target (the environment must be deterministic given the
messages, as toolcalc is), then `from_here()` forgives what the prefix cost (toolcalc: an earlier
invalid call would make success 0 whatever follows, and most hints follow one), its prompt becomes
the conversation so far, and `k` continuations are sampled from it with the hint as a system
message before the target's turn (as the teacher sees it, trajectory.with_hint) and `k` without,
both by the teacher's weights: what is distilled is the teacher's hinted distribution, so the probe
asks whether the hint makes the teacher better from here. (With a frozen teacher the policy's own
weights drift from it; sampled with them, the hinted arm measured how a policy never trained on
hinted contexts reads one: after 20-50 steps rules that still helped the teacher read negative,
docs/results.md.) All positions go in one rollout of a fixed row count, so it compiles once; a
position whose hinted prefix leaves no room for a message is not probed. The gain is the teacher's
log-prob (teacher weights, with the hint) minus the student's (current weights, without it) of the
corrected token: the first token where the first hinted continuation leaves the original message
(0 when it writes the same message again).
"""

import functools

import jax
import numpy as np

from research.model import transformer
from research.model.config import ModelConfig
from research.rl.update import losses
from research.rl.update import teacher as teacher_lib
from research.rl.feedback.critics import Feedback
from research.rl.feedback.governance import Probe
from research.rl.rollout.sampler import RolloutBackend
from research.rl.rollout.trajectory import Trajectory
from research.tokenizer import chat


@functools.partial(jax.jit, static_argnames=('cfg', 'temperature'))
def full_logp(params, tokens, seg, *, cfg: ModelConfig, temperature: float):
  """Log-probs over the vocabulary at every position, B x T x V (probes and the viewer: few rows)."""
  h = teacher_lib.reference_hidden(params, tokens, seg, cfg=cfg)
  return losses.tempered_log_softmax(transformer.lm_head(params['lm_head']['kernel'], h, cfg), temperature)


@functools.partial(jax.jit, static_argnames=('cfg', 'temperature'))
def teacher_logp(params, t_tokens, t_seg, t_pos, *, cfg: ModelConfig, temperature: float):
  """The hinted teacher's log-probs at the target positions, N x S x V."""
  h = teacher_lib.teacher_hidden(params, t_tokens, t_seg, t_pos, cfg=cfg)
  return losses.tempered_log_softmax(transformer.lm_head(params['lm_head']['kernel'], h, cfg), temperature)


def replay(env, traj: Trajectory, message: int, hint: str | None):
  """A new episode at `traj`'s state before model message `message`, its prompt the conversation so far."""
  ep = env.reset(traj.task)
  conv = list(traj.prompt)
  for j, m in enumerate(traj.messages[:message]):
    ep.step(m.text)
    conv.append({'role': 'assistant', 'content': m.text})
    conv.append({'role': 'tool', 'content': traj.observations[j]})
  if not hasattr(ep, 'from_here'):
    raise TypeError(f'{type(ep).__name__}: efficacy probes need an episode with from_here() (env_toolcalc)')
  ep.from_here()
  ep.prompt = conv + ([{'role': 'system', 'content': hint}] if hint is not None else [])
  return ep


class Prober:
  """Efficacy probes on `sampler` (rows = 2 * k * probes_per_step, fixed)."""

  def __init__(self, sampler: RolloutBackend, env, k: int, probes_per_step: int):
    self.sampler, self.env, self.k, self.slots = sampler, env, k, probes_per_step
    self.tok, self.cfg, self.s = sampler.tok, sampler.cfg, sampler.s

  def __call__(self, params, teacher_params, trajs: list[Trajectory], positions: list[tuple[int, Feedback]],
               key) -> list[Probe]:
    positions = [p for p in positions if self._fits(trajs[p[0]], p[1])][:self.slots]
    if not positions:
      return []
    episodes = [replay(self.env, trajs[i], fb.message, hint)
                for i, fb in positions for hint in [fb.hint] * self.k + [None] * self.k]
    rows = 2 * self.k * self.slots
    episodes += [replay(self.env, trajs[positions[0][0]], positions[0][1].message, None)
                 for _ in range(rows - len(episodes))]
    out, _ = self.sampler.rollout(teacher_params, episodes, key)
    ok = np.array([t.success for t in out], float).reshape(-1, 2, self.k)
    gains = self._gains(params, teacher_params, trajs, positions, out[::2 * self.k])
    return [Probe(fb.tag, float(ok[j, 0].mean()), float(ok[j, 1].mean()), gains[j])
            for j, (_, fb) in enumerate(positions)]

  def _fits(self, traj: Trajectory, fb: Feedback) -> bool:
    """The hinted prefix, rendered from text, leaves room for a message within sampler.max_len."""
    ctx = chat.render(self.tok, replay(self.env, traj, fb.message, fb.hint).prompt, add_generation_prompt=True)[0]
    return len(ctx) + self.s.max_turn_tokens <= self.s.max_len

  def _gains(self, params, teacher_params, trajs, positions, hinted: list[Trajectory]) -> list[float]:
    """Teacher (hinted) minus student (plain) log-prob of each position's corrected token."""
    n, seq = self.slots, self.s.max_len
    rows = {'hint': np.full((n, seq), self.tok.pad_id, np.int32), 'plain': np.full((n, seq), self.tok.pad_id, np.int32)}
    at, tok_at, same = np.zeros((2, n), np.int32), np.zeros(n, np.int32), np.zeros(n, bool)
    for j, ((i, fb), h) in enumerate(zip(positions, hinted)):
      orig = trajs[i].messages[fb.message]
      old = trajs[i].tokens[orig.start:orig.end]
      new = h.tokens[h.messages[0].start:h.messages[0].end] if h.messages else old
      d = next((p for p, (a, b) in enumerate(zip(new, old)) if a != b), None)
      same[j] = d is None
      d = 0 if d is None else d
      for r, (name, hint) in enumerate((('hint', fb.hint), ('plain', None))):
        ctx = chat.render(self.tok, replay(self.env, trajs[i], fb.message, hint).prompt, add_generation_prompt=True)[0]
        ids = (ctx + list(new[:d + 1]))[:seq]
        rows[name][j, :len(ids)] = ids
        at[r, j] = min(len(ctx) + d, seq) - 1
      tok_at[j] = new[d]
    lp = [np.asarray(full_logp(p, rows[name], (rows[name] != self.tok.pad_id).astype(np.int32),
                                                cfg=self.cfg, temperature=self.s.temperature))
          for p, name in ((teacher_params, 'hint'), (params, 'plain'))]
    g = [float(lp[0][j, at[0, j], tok_at[j]] - lp[1][j, at[1, j], tok_at[j]]) for j in range(len(positions))]
    return [0.0 if s else x for x, s in zip(g, same)]


def viewer_records(sampler: RolloutBackend, params, teacher_params, trajs: list[Trajectory],
                   feedback: list[tuple[int, Feedback]], n: int) -> list[dict]:
  """governance_report.viewer_html records of the first `n` trajectories with a hint (then others):
  each hint placed before its message, and the teacher-student KL (teacher weights with the hint,
  policy without) per token of each hinted message."""
  tok, s = sampler.tok, sampler.s
  hinted = sorted({i for i, _ in feedback})
  pick = (hinted + [i for i in range(len(trajs)) if i not in hinted])[:n]
  fbs = [(i, fb) for i, fb in feedback if i in pick]
  kl = {}
  if fbs:
    tg = teacher_lib.build_targets(tok, trajs, fbs, {i: (r, 0) for r, i in enumerate(pick)}, s.max_len,
                                   s.max_turn_tokens, len(fbs))
    t_logp = np.asarray(teacher_logp(teacher_params, tg.t_tokens, tg.t_seg, tg.t_pos,
                                                 cfg=sampler.cfg, temperature=s.temperature))
    seq = np.full((len(pick), s.max_len), tok.pad_id, np.int32)
    for r, i in enumerate(pick):
      seq[r, :min(len(trajs[i].tokens), s.max_len)] = trajs[i].tokens[:s.max_len]
    s_all = np.asarray(full_logp(params, seq, (seq != tok.pad_id).astype(np.int32),
                                                  cfg=sampler.cfg, temperature=s.temperature))
    for j, (i, fb) in enumerate(tg.feedback):
      s_logp = s_all[tg.d_row[j], tg.d_pos[j]]
      kl[(i, fb.message)] = (np.exp(t_logp[j]) * (t_logp[j] - s_logp)).sum(-1)[tg.d_mask[j] > 0]
  return [_record(tok, trajs[i], [fb for k, fb in feedback if k == i], kl, i) for i in pick]


def _record(tok, traj: Trajectory, fbs: list[Feedback], kl: dict, i: int) -> dict:
  turns, by_msg = [], {fb.message: fb for fb in fbs}
  for j, m in enumerate(traj.messages):
    if j in by_msg:
      turns.append({'role': 'system', 'text': by_msg[j].hint, 'rule': by_msg[j].tag})
    turn = {'role': 'assistant', 'text': m.text}
    if (i, j) in kl:
      ids = traj.tokens[m.start:m.end]
      turn['tokens'] = [[tok.decode([t]), float(d)] for t, d in zip(ids, kl[(i, j)])]
    turns.append(turn)
    if j < len(traj.observations):
      turns.append({'role': 'tool', 'text': traj.observations[j]})
  last = traj.messages[-1].info if traj.messages else {}
  return {'title': f'rollout {i}', 'prompt': traj.prompt[-1]['content'] if traj.prompt else '', 'turns': turns,
          'reward': float(traj.reward), 'success': bool(traj.success),
          'grade': str(last.get('grade') or traj.fault or 'not graded')}
