"""The RL loop: sample tasks, roll out G per task, reward, critique, teacher pass, update, log.

    summary = run(config, workdir)       # launch/rl.py wraps it; experiments/toolcalc_rl.py configures

Start: a random init, or a base model (`config.base.checkpoint`, an orbax checkpoint written by
`launch.convert --from_hf`, whose model config it carries; `config.base.tokenizer`, the Hugging Face
folder with its tokenizer and chat template). Warm start: `config.init_checkpoint` (a workdir whose
warmstart/ holds one), else the supervised stage (research/rl/sft.py, `sft.steps` may be 0) on the
environment's demonstrations from the start, saved to workdir/warmstart.
Each step: rollouts (research/rl/sampler.py) -> group-baseline advantages -> critic feedback ->
teacher log-probs on the hinted contexts -> one optimizer step on
pg_coef * policy gradient + distill_coef * distillation (research/rl/losses.py).
Shapes are fixed (all rollouts x sampler.max_len, rl.max_targets distillation slots), so the update
and the teacher pass compile once per run; a step where every group tied and no hint fired is skipped.
Arms of the ablation are coefficient settings: outcome-only (distill_coef=0), targeted feedback
(both), distillation alone (pg_coef=0). Evaluation on a fixed task set before, during and after
gives the success curves and the per-rule before/after table (tasks where a rule fired at the start).
"""

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from research.checkpoint.manager import Checkpointer, abstract
from research.hf import convert
from research.metrics.writer import MetricsWriter
from research.model import config as model_config
from research.model import moe as moe_lib
from research.model import transformer
from research.rl import critics as critics_lib
from research.rl import env_pyfunc, env_toolcalc, losses, sft, teacher as teacher_lib
from research.rl.sampler import Sampler, SamplerConfig
from research.rl.trajectory import routes_batch, to_batch
from research.tokenizer.base import ByteTokenizer
from research.tokenizer.hf import HFTokenizer
from research.train import optimizer as optim
from research.train import step as step_lib


def make_env(c: ml_collections.ConfigDict):
  if c.name == 'toolcalc':
    tools = {'warm': env_toolcalc.WARM_TOOLS, 'rl': env_toolcalc.RL_TOOLS}.get(c.tools)
    if tools is None:
      raise ValueError(f'env.tools={c.tools!r}: expected "warm" or "rl"')
    return env_toolcalc.ToolCalc(tools, c.max_ops, c.max_operand)
  if c.name == 'pyfunc':
    return env_pyfunc.PyFunc()
  raise ValueError(f'env.name={c.name!r}: expected "toolcalc" or "pyfunc"')


def _demos(c: ml_collections.ConfigDict):
  if c.env.name != 'toolcalc':
    raise ValueError(f'env.name={c.env.name!r} has no demonstration generator; give init_checkpoint')
  return lambda rng, n: env_toolcalc.demonstrations(
      rng, n, hint_fraction=c.sft.hint_fraction, max_ops=c.env.max_ops, max_operand=c.env.max_operand)


def objective(params, batch, tgt, *, cfg, lc, temperature, denom):
  """pg_coef * policy gradient + distill_coef * distillation + router losses. Returns (loss, aux)."""
  logits, aux, _ = transformer.forward(params, batch['tokens'], cfg, segment_ids_BxT=batch['segment_ids'],
                                       routes=batch.get('routes'))
  logp_all = jax.nn.log_softmax(logits / temperature, axis=-1)
  logp = jnp.take_along_axis(logp_all, batch['targets'][..., None], -1)[..., 0]
  mask = batch['mask']
  on_target = jnp.zeros_like(mask).at[tgt['d_row'][:, None], tgt['d_pos']].max(tgt['d_mask'])
  if not lc.pg_on_targets:  # On a hinted message the teacher's per-token signal replaces the advantage.
    mask = mask * (1 - on_target)
  pg, clip_frac = losses.pg_loss(logp, batch['sampler_logp'], batch['adv'], mask, denom, clip_eps=lc.clip_eps)
  s_logp = logp_all[tgt['d_row'][:, None], tgt['d_pos']]
  dl, kl_N, gated = losses.distill_loss(s_logp, tgt['t_logp'], tgt['d_tok'], tgt['d_mask'],
                                        kind=lc.distill_kind, top_k=lc.distill_top_k, gate=lc.gate,
                                        margin=lc.gate_margin, until_divergence=lc.until_divergence)
  loss = lc.pg_coef * pg + lc.distill_coef * dl
  anchor = jnp.zeros(())
  if lc.anchor_coef:  # Reverse KL to the teacher weights without a hint on every other policy token.
    keep = batch['mask'] * (1 - on_target)
    kl = jnp.sum(jnp.exp(logp_all) * (logp_all - tgt['ref_logp']), -1)
    anchor = jnp.sum(kl * keep) / jnp.maximum(jnp.sum(keep), 1.0)
    loss += lc.anchor_coef * anchor
  if 'load' in aux:
    loss += cfg.aux_loss_coef * jnp.sum(aux['aux_loss']) + cfg.z_loss_coef * jnp.sum(aux['z_loss'])
  n = jnp.maximum(jnp.sum(batch['mask']), 1.0)
  diff = (batch['sampler_logp'] - jax.lax.stop_gradient(logp)) * batch['mask']
  return loss, {'pg_loss': pg, 'distill_loss': dl, 'anchor_kl': anchor, 'kl_N': kl_N, 'gated_frac': gated, 'clip_frac': clip_frac,
                'logp_mismatch': jnp.sum(jnp.abs(diff)) / n, 'logp_mismatch_mean': jnp.sum(diff) / n,
                'load': aux.get('load')}


def make_update(cfg, tx, lc, temperature):
  def update(params, opt_state, batch, tgt, denom):
    (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(
        params, batch, tgt, cfg=cfg, lc=lc, temperature=temperature, denom=denom)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    load = aux.pop('load')
    if load is not None and cfg.router == 'sigmoid' and cfg.bias_update_rate:
      moe_p = params['moe_layers']['moe']
      params['moe_layers']['moe'] = {**moe_p, 'router_bias': jax.vmap(moe_lib.update_router_bias, (0, 0, None))(
          moe_p['router_bias'], load, cfg.bias_update_rate)}
    return params, opt_state, {**aux, 'loss': loss, 'grad_norm': optax.tree.norm(grads)}
  return jax.jit(update, donate_argnums=(0, 1))


@dataclasses.dataclass(frozen=True)
class LossConfig:
  pg_coef: float
  distill_coef: float
  clip_eps: float
  std_norm: bool
  norm_tokens: int
  distill_kind: str
  distill_top_k: int
  gate: str
  gate_margin: float
  until_divergence: bool
  pg_on_targets: bool
  anchor_coef: float

  @classmethod
  def from_config(cls, c):
    if c.distill_kind not in losses.DISTILL_KINDS:
      raise ValueError(f'loss.distill_kind={c.distill_kind!r}: expected one of {losses.DISTILL_KINDS}')
    if c.gate not in losses.GATES:
      raise ValueError(f'loss.gate={c.gate!r}: expected one of {losses.GATES}')
    return cls(**{f.name: c[f.name] for f in dataclasses.fields(cls)})


class Runner:
  """One RL run's pieces; `run()` drives them. Scripts may also call `evaluate` directly."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.c, self.workdir = config, workdir
    os.makedirs(workdir, exist_ok=True)
    self.env = make_env(config.env)
    base = config.get('base') or ml_collections.ConfigDict({'checkpoint': '', 'tokenizer': ''})
    self.base_checkpoint = base.checkpoint
    if base.tokenizer:
      self.tok = HFTokenizer(base.tokenizer)
    else:
      if config.env.get('word_tokens') and not hasattr(self.env, 'words'):
        raise ValueError(f'env.word_tokens: env {config.env.name!r} has no word list')
      self.tok = ByteTokenizer(self.env.words if config.env.get('word_tokens') else ())
    # A base checkpoint brings its own model config; `config.model` then describes nothing.
    self.cfg = (convert.read_model_config(base.checkpoint) if base.checkpoint
                else model_config.from_dict(config.model.to_dict()))
    if self.cfg.vocab_size < self.tok.vocab_size:
      raise ValueError(f'model.vocab_size={self.cfg.vocab_size} is smaller than the tokenizer\'s '
                       f'{self.tok.vocab_size}')
    s = config.sampler
    self.scfg = SamplerConfig(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                              max_turn_tokens=s.max_turn_tokens, max_turns=s.max_turns, max_len=s.max_len,
                              max_obs_tokens=s.max_obs_tokens, record_routes=config.rl.router_replay)
    self.sampler = Sampler(self.cfg, self.tok, self.scfg)
    self.batch_rows = config.rl.tasks_per_step * config.rl.group_size
    self.critic = critics_lib.Critic(list(config.critic.rules))
    self.lc = LossConfig.from_config(config.loss)
    if self.lc.pg_coef == 0 and self.lc.distill_coef == 0:
      raise ValueError('loss.pg_coef and loss.distill_coef are both 0: nothing to train')
    self.teacher_fn = functools.partial(teacher_lib.teacher_logp, cfg=self.cfg, temperature=s.temperature)

  # -------------------------------------------------------------------------------------------
  def warm_start(self, log) -> dict:
    """Params after the supervised stage (run once; reused from init_checkpoint or this workdir)."""
    c = self.c
    params = (convert.load_params(self.base_checkpoint, self.cfg)[0] if self.base_checkpoint
              else transformer.init(self.cfg, jax.random.key(c.seed)))
    src = c.init_checkpoint or self.workdir
    ckpt = Checkpointer(os.path.join(src, 'warmstart'), save_every=1, keep=1, async_save=False)
    restored = ckpt.restore(abstract({'params': params}))
    if restored is not None:
      ckpt.close()
      return restored.state['params']
    if c.init_checkpoint:
      raise FileNotFoundError(f'init_checkpoint={c.init_checkpoint!r} has no warmstart/ checkpoint')
    tx = optim.make_optimizer(c.sft.optimizer, c.sft.steps, model_cfg=self.cfg)
    params, _ = sft.train(params, self.cfg, self.tok, tx, _demos(c), steps=c.sft.steps,
                          batch_size=c.sft.batch_size, seq_len=c.sampler.max_len, seed=c.seed, log=log)
    ckpt.save(0, {'params': params}, force=True)
    ckpt.close()
    return params

  def evaluate(self, params, tasks, key, batch: int):
    """One sampled rollout per task, in chunks of `batch` rows (the training shape)."""
    trajs = []
    for i in range(0, len(tasks), batch):
      chunk = tasks[i:i + batch]
      eps = [self.env.reset(t) for t in chunk]
      eps += [self.env.reset(chunk[0]) for _ in range(batch - len(chunk))]
      out, _ = self.sampler.rollout(params, eps, jax.random.fold_in(key, i), tasks=chunk + [None] * (batch - len(chunk)))
      trajs += out[:len(chunk)]
    return trajs

  def _eval_row(self, params, tasks, fired: dict, prefix='eval'):
    trajs = self.evaluate(params, tasks, jax.random.key(self.c.seed + 10_007), self.batch_rows)
    ok = np.array([t.success for t in trajs])
    row = {f'{prefix}_success': float(ok.mean()), f'{prefix}_reward': float(np.mean([t.reward for t in trajs]))}
    for rule, idx in fired.items():
      if idx:
        row[f'{prefix}/{rule}/success'] = float(ok[idx].mean())
    return row, trajs

  # -------------------------------------------------------------------------------------------
  def run(self) -> dict:
    c, wd = self.c, self.workdir
    r = c.rl
    writer = MetricsWriter(wd, total_steps=r.steps, tensorboard=c.tensorboard, console=False)
    sft_log = open(os.path.join(wd, 'warmstart.jsonl'), 'a')
    params = self.warm_start(lambda i, row: sft_log.write(json.dumps(row) + '\n'))
    sft_log.close()
    tx = step_lib.freeze_untrainable(optim.make_optimizer(c.optimizer, r.steps, model_cfg=self.cfg))
    opt_state = tx.init(params)
    teacher = teacher_lib.TeacherWeights(c.teacher.kind, params, c.teacher.ema_decay)
    update = make_update(self.cfg, tx, self.lc, self.scfg.temperature)
    ckpt = Checkpointer(os.path.join(wd, 'checkpoints'), save_every=c.checkpoint_every, keep=2,
                        config=c.to_dict())
    state = {'params': params, 'opt_state': opt_state, 'teacher': teacher.params(params)}
    restored = ckpt.restore(abstract(state))
    start = 0
    if restored is not None:
      start, state = restored.step, restored.state
      params, opt_state = state['params'], state['opt_state']
      teacher.fixed = None if teacher.kind == 'live' else state['teacher']
      writer.truncate(start)

    erng = np.random.default_rng([c.seed, 1])
    eval_tasks = [self.env.sample_task(erng) for _ in range(c.eval.num_tasks)]
    before_path = os.path.join(wd, 'eval_before.json')
    if os.path.exists(before_path):
      before = json.load(open(before_path))
    else:
      row, trajs = self._eval_row(params, eval_tasks, {})
      fired = {name: [] for name in self.critic.names}
      for i, t in enumerate(trajs):
        for rule in {fb.rule for fb in self.critic(t)}:
          fired[rule].append(i)
      before = {'row': row, 'fired': fired,
                'by_rule': {k: float(np.mean([trajs[i].success for i in v])) if v else None
                            for k, v in fired.items()}}
      json.dump(before, open(before_path, 'w'))
    if start == 0:
      writer.write(0, {**before['row'], 'rollouts': 0})
    fired = before['fired']

    bar = tqdm.tqdm(total=r.steps, initial=start, desc='rl', unit='step')
    rollouts = start * self.batch_rows
    for step in range(start + 1, r.steps + 1):
      row = self.train_step(step, params, opt_state, teacher, update)
      params, opt_state = row.pop('_params'), row.pop('_opt_state')
      rollouts += self.batch_rows
      row['rollouts'] = rollouts
      if step % c.eval.every == 0 or step == r.steps:
        row.update(self._eval_row(params, eval_tasks, fired)[0])
      writer.write(step, row)
      bar.update(1)
      bar.set_postfix(success=f'{row["success_rate"]:.2f}', fb=int(row['feedback_count']),
                      kl=f'{row["distill_kl"]:.3f}', eval=f'{row.get("eval_success", float("nan")):.2f}')
      ckpt.save(step, {'params': params, 'opt_state': opt_state, 'teacher': teacher.params(params)},
                force=step == r.steps)
    bar.close()
    ckpt.close()
    writer.close()
    after, _ = self._eval_row(params, eval_tasks, fired, prefix='final')
    summary = {
        'before': before['row']['eval_success'], 'after': after['final_success'],
        'by_rule': {k: {'tasks': len(fired[k]), 'before': before['by_rule'][k],
                        'after': after.get(f'final/{k}/success')} for k in fired},
        'steps': r.steps, 'rollouts': r.steps * self.batch_rows, 'eval_tasks': len(eval_tasks),
    }
    json.dump(summary, open(os.path.join(wd, 'summary.json'), 'w'), indent=1)
    self.params = params
    return summary

  # -------------------------------------------------------------------------------------------
  def train_step(self, step, params, opt_state, teacher, update) -> dict:
    c, r, lc, tok = self.c, self.c.rl, self.lc, self.tok
    rng = np.random.default_rng([c.seed, 2, step])
    tasks = [self.env.sample_task(rng) for _ in range(r.tasks_per_step)]
    tasks = [t for t in tasks for _ in range(r.group_size)]
    groups = np.repeat(np.arange(r.tasks_per_step), r.group_size)
    t0 = time.perf_counter()
    trajs, st = self.sampler.rollout(params, [self.env.reset(t) for t in tasks],
                                     jax.random.key(c.seed * 1_000_003 + step), tasks=tasks, groups=groups)
    valid = np.array([t.fault is None for t in trajs])
    rewards = np.array([t.reward for t in trajs])
    adv = losses.group_advantages(rewards, groups, valid, std_norm=lc.std_norm)
    feedback = [(i, fb) for i, t in enumerate(trajs) for fb in self.critic(t)]
    t1 = time.perf_counter()
    fbk = feedback if lc.distill_coef > 0 else []
    if len(fbk) > r.max_targets:  # A fixed number of distillation slots (one compiled shape).
      keep = np.sort(rng.choice(len(fbk), r.max_targets, replace=False))
      fbk = [fbk[k] for k in keep]
    active = (adv != 0) & valid if lc.pg_coef else np.zeros(len(trajs), bool)
    active[[i for i, _ in fbk]] = True
    row = {'reward_mean': float(rewards[valid].mean()) if valid.any() else 0.0,
           'success_rate': float(np.mean([t.success for t in trajs if t.fault is None] or [0.0])),
           'feedback_count': len(feedback), 'targets_dropped': len(feedback) - len(fbk) if lc.distill_coef else 0,
           'env_faults': st.faults, 'truncated': st.truncated,
           'obs_truncated': st.obs_truncated, 'malformed_tokens': st.malformed_tokens,
           'rollout_tokens_per_s': st.new_tokens / max(st.sample_s, 1e-9),
           'policy_tokens': float(np.mean([t.num_policy_tokens for t in trajs])),
           'time_sample': st.sample_s, 'time_env': st.env_s, 'rows_trained': int(active.sum()),
           'pg_loss': 0.0, 'distill_loss': 0.0, 'distill_kl': 0.0, 'hint_overflow': 0}
    for name in self.critic.names:
      idx = [i for i, fb in feedback if fb.rule == name]
      row[f'rule/{name}/fires'] = len(idx)
      grp = {int(groups[i]) for i in idx}
      if grp:
        row[f'rule/{name}/group_success'] = float(np.mean([trajs[i].success for i in range(len(trajs))
                                                           if int(groups[i]) in grp]))
    if not active.any():  # Every group tied and no feedback: no gradient this step.
      row.update(time_teacher=0.0, time_update=0.0, _params=params, _opt_state=opt_state)
      return row
    # Fixed shapes (all rollouts x max_len, max_targets slots): one compiled update for the run.
    seq = self.scfg.max_len
    batch = to_batch(trajs, seq, tok.pad_id)
    batch['mask'] *= valid[:, None]
    batch['adv'] = np.where(valid, adv, 0.0).astype(np.float32)
    if r.router_replay and self.cfg.num_moe_layers:
      batch['routes'] = routes_batch(trajs, seq, len(trajs), self.cfg.num_moe_layers, self.cfg.num_experts_per_tok)
    tg = teacher_lib.build_targets(tok, trajs, fbk, {i: i for i in range(len(trajs))}, seq,
                                   self.scfg.max_turn_tokens, r.max_targets)
    t2 = time.perf_counter()
    if tg.feedback:
      t_logp = self.teacher_fn(teacher.params(params), tg.t_tokens, tg.t_seg, tg.t_pos)
      t_logp.block_until_ready()
    else:
      t_logp = jnp.zeros((*tg.d_tok.shape, self.cfg.vocab_size), jnp.float32)
    t3 = time.perf_counter()
    tgt = {'d_row': tg.d_row, 'd_pos': tg.d_pos, 'd_tok': tg.d_tok, 'd_mask': tg.d_mask, 't_logp': t_logp}
    if lc.anchor_coef:
      tgt['ref_logp'] = teacher_lib.reference_logp(teacher.params(params), batch['tokens'], batch['segment_ids'],
                                                   cfg=self.cfg, temperature=self.scfg.temperature)
    denom = float(max(valid.sum(), 1) * lc.norm_tokens)
    params, opt_state, m = update(params, opt_state, batch, tgt, denom)
    teacher.update(params)
    m = jax.device_get(m)
    t4 = time.perf_counter()
    kl_N = m.pop('kl_N')[:len(tg.feedback)]
    row.update({k: float(v) for k, v in m.items()})
    row.update(time_teacher=t3 - t2, time_update=t4 - t3, time_critic=t1 - t0 - st.sample_s - st.env_s,
               hint_overflow=tg.overflow, distill_kl=float(kl_N.mean()) if len(kl_N) else 0.0,
               _params=params, _opt_state=opt_state)
    for name in self.critic.names:
      ks = [k for k, (_, fb) in zip(kl_N, tg.feedback) if fb.rule == name]
      if ks:
        row[f'rule/{name}/kl'] = float(np.mean(ks))
    return row


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  return Runner(config, workdir).run()
