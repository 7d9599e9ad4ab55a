"""The RL loop: sample tasks, roll out G per task, reward, critique, teacher pass, update, log.

    summary = run(config, workdir)       # launch/rl.py wraps it; experiments/toolcalc_rl.py configures

`config` is an RLExperimentConfig (below), or its ConfigDict (every section listed in docs/training.md).

Start: a random init, or a base model (`base.checkpoint`, an orbax checkpoint written by
`launch.convert --from_hf`, whose model config it carries; `base.tokenizer`, the Hugging Face
folder with its tokenizer and chat template). Warm start: `init_checkpoint` (a workdir whose
warmstart/ holds one), else the supervised stage (research/rl/sft.py, `sft.steps` may be 0) on the
environment's demonstrations from the start, saved to workdir/warmstart.
Each step: rollouts (research/rl/rollout/backends.py: ours or vLLM; with rl.staleness > 0 sampled
ahead on a thread with older params; with rl.stream the first tasks_per_step groups to finish, see
below) -> group-baseline advantages -> critic feedback -> teacher
hidden states on the hinted contexts -> one train step (research/train/step.py, on the Trainer's
mesh) on `objective`: pg_coef * policy gradient + distill_coef * distillation + anchor
(research/rl/update/losses.py). The update packs the rollouts into rows of sampler.max_len (one
segment each), in one of rl.row_buckets row counts, each compiled at the first update; the teacher
pass has one shape (rl.max_targets distillation slots); so no step after the first compiles. A step
where every group tied and no hint fired is skipped.
Streaming (rl.stream, research/rl/rollout/groups.py): the sampler keeps its rows busy (a row whose
episode ended takes a new group's episode at the next turn: continuous batching) and each update
takes the first tasks_per_step groups whose episodes have all ended. Episodes still running carry
over and go on sampling with each new update's params; their tokens keep the sampler's log-probs,
which the update's token-level truncated importance weights correct (sampler.Stream: the KV cache
is kept across updates, not recomputed). A group whose episode began more than
rl.stream_max_staleness updates ago is dropped whole, never scored. Each row logs
episodes_carried (trained episodes begun under older params), staleness_mean (their updates
behind), episodes_running (carried on) and stale_dropped.
Arms of the ablation are coefficient settings: outcome-only (distill_coef=0), targeted feedback
(both), distillation alone (pg_coef=0). Evaluation on a fixed task set before, during and after
gives the success curves and the per-rule before/after table (tasks where a rule fired at the start).
"""

from collections.abc import Callable
from concurrent import futures
import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from research import configs
from research.checkpoint.manager import Checkpointer, abstract
from research.hf import convert
from research.metrics.writer import MetricsWriter
from research.parallel import mesh as mesh_lib
from research.parallel import sharding
from research.rl import sft
from research.rl.config import RLExperimentConfig
from research.rl.envs import registry
from research.rl.feedback import critics as critics_lib
from research.rl.feedback import governance
from research.rl.feedback import probe
from research.rl.feedback.critics import Feedback
from research.rl.rollout import backends
from research.rl.rollout import groups as groups_lib
from research.rl.rollout.sampler import RolloutStats, Stream, episode_keys
from research.rl.rollout.trajectory import Place, Trajectory, one_per_row, pack, routes_batch, to_batch
from research.rl.update import losses
from research.rl.update import teacher as teacher_lib
from research.rl.update.objective import objective
from research.tokenizer.base import ByteTokenizer
from research.tokenizer.hf import HFTokenizer
from research.train import loop as train_loop
from research.train import optimizer as optim
from research.train import step as step_lib


def _tokenizer(c: RLExperimentConfig, env):
  """The base model's tokenizer, else env.tokenizer, else bytes plus (with env.word_tokens) the
  environment's words."""
  if c.base.tokenizer or c.env.tokenizer:
    return HFTokenizer(c.base.tokenizer or c.env.tokenizer)
  if c.env.word_tokens and not env.words:
    raise ValueError(f'env.word_tokens: env {c.env.name!r} has no word list')
  return ByteTokenizer(env.words if c.env.word_tokens else ())


@dataclasses.dataclass
class RLState:
  """What an RL step changes: the policy and its optimizer state (the train step's), the teacher."""
  train: step_lib.TrainState
  teacher: teacher_lib.TeacherWeights

  @property
  def params(self):
    return self.train.params

  def checkpoint_tree(self) -> dict:
    return {'params': self.params, 'opt_state': self.train.opt_state, 'teacher': self.teacher.params(self.params)}


@dataclasses.dataclass
class Sampled:
  """One step's rollouts with their rewards and advantages (no governance: sampled ahead on a
  thread with rl.staleness > 0)."""
  trajs: list[Trajectory]
  groups: np.ndarray                # Task index per rollout.
  stats: RolloutStats
  valid: np.ndarray                 # No environment fault.
  rewards: np.ndarray
  adv: np.ndarray                   # Group-baseline advantages.
  env_metrics: dict[str, float]     # The environment's own (repo: hack_rate, env_seconds, tool calls).
  rng: np.random.Generator          # The step's generator after drawing its tasks (picks targets).
  taken: groups_lib.Taken | None = None  # rl.stream: the groups' take (staleness, carried, dropped).


@dataclasses.dataclass
class Rollouts(Sampled):
  """Sampled rollouts with the governed feedback of the step (made on the main thread)."""
  feedback: list[tuple[int, Feedback]] = dataclasses.field(default_factory=list)  # The active rules' hints.
  all_feedback: list[tuple[int, Feedback]] = dataclasses.field(default_factory=list)  # Suspended rules' too.
  targets: list[tuple[int, Feedback]] = dataclasses.field(default_factory=list)  # Distilled (<= rl.max_targets).
  active: np.ndarray | None = None  # Rollouts with a gradient (rows_trained): a nonzero advantage or a target.
  time_critic: float = 0.0


class Runner:
  """One RL run's pieces; `run()` drives them. Scripts may also call `evaluate` directly."""

  def __init__(self, config: RLExperimentConfig, workdir: str):
    self.c = c = configs.from_dict(RLExperimentConfig, config)
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    self.env = registry.make(c.env, workdir)
    self.tok = _tokenizer(c, self.env)
    # A base checkpoint brings its own model config; `model` then describes nothing.
    self.cfg = convert.read_model_config(c.base.checkpoint) if c.base.checkpoint else c.model
    if self.cfg.vocab_size < self.tok.vocab_size:
      raise ValueError(f'model.vocab_size={self.cfg.vocab_size} is smaller than the tokenizer\'s '
                       f'{self.tok.vocab_size}')
    self.scfg, self.lc = c.sampler, c.loss
    self.batch_rows = c.rl.tasks_per_step * c.rl.group_size
    if c.rl.stream and jax.process_count() > 1:
      # Every process steps every episode; which groups finish first depends on each one's timing.
      raise ValueError(f'rl.stream runs in one process (this run has {jax.process_count()}): the '
                       'groups an update takes depend on when episodes finish, which processes do not share')
    self.trainer = self._trainer(c.optimizer, c.rl.steps)
    self.sampler = backends.make(c.rollout, self.cfg, self.tok, c.sampler, jit=self.trainer.jit)
    # Router replay needs the routes the tokens were sampled with; else the update routes them itself.
    self.replay_routes = self.sampler.records_routes and self.cfg.num_moe_layers > 0
    if c.sampler.record_routes and not self.sampler.records_routes:
      print(f'sampler.record_routes: rollout.backend={c.rollout.backend!r} returns no routes here; '
            'the update recomputes them (routes_replayed=0 in the metrics)')
    self.critic = critics_lib.Critic(list(c.critic.rules))
    g = c.governance
    self.gov = governance.Governance(g, self.critic, workdir, probe.Prober(self.sampler, self.env, g.k, g.probes_per_step))
    rows = self.trainer.batch_sharding  # Rollouts and distillation slots split alike; the head as a param.
    # Their outputs go into the update's batch: laid out as the compiled update takes them.
    self.teacher_fn = self.trainer.jit(functools.partial(teacher_lib.teacher_hidden, cfg=self.cfg), out_shardings=rows)
    self.reference_fn = self.trainer.jit(functools.partial(teacher_lib.reference_hidden, cfg=self.cfg),
                                         out_shardings=rows)
    self.loss = functools.partial(objective, lc=c.loss, temperature=c.sampler.temperature)
    self.batch_shardings = {'rows': rows, 'targets': rows,
                            'teacher_head': self.trainer.param_shardings['lm_head']['kernel']}
    ways = mesh_lib.axis_size(self.trainer.mesh, sharding.mesh_axes('act_batch', self.trainer.rules))
    self.row_counts = row_counts(self.batch_rows, c.rl.row_buckets, ways)
    self._programs = {}  # (program, rows) -> the executable: the update's, compiled ahead (_compiled).
    self.step = None  # The jitted train step; fresh_state makes it (it takes the started state's shardings).
    self.state: RLState | None = None  # After run(): the final policy, optimizer state and teacher.

  def _trainer(self, oc: optim.OptimizerConfig, steps: int) -> step_lib.Trainer:
    """The train step's Trainer on the run's mesh (RL batch rows and slots must split over it)."""
    shape = mesh_lib.parse_mesh_spec(self.c.mesh)
    ways = mesh_lib.axis_size(shape, sharding.mesh_axes('act_batch'))
    for f, n in (('rl.tasks_per_step * rl.group_size', self.batch_rows), ('rl.max_targets', self.c.rl.max_targets)):
      if n % ways:
        raise ValueError(f'{f}={n} is not divisible by the {ways} devices that split rows on mesh={self.c.mesh!r}')
    train_loop.check_divisible(self.cfg, shape, ways)
    mesh = mesh_lib.make_mesh(shape)
    return step_lib.Trainer(self.cfg, optim.make_optimizer(oc, steps, self.cfg, mesh), mesh)

  # -------------------------------------------------------------------------------------------
  def warm_start(self, log) -> dict:
    """Params after the supervised stage (run once; reused from init_checkpoint or this workdir)."""
    c = self.c
    params = (jax.device_put(convert.load_params(c.base.checkpoint, self.cfg)[0], self.trainer.param_shardings)
              if c.base.checkpoint else self.trainer.init(jax.random.key(c.seed)).params)
    src = c.init_checkpoint or self.workdir
    ckpt = Checkpointer(os.path.join(src, 'warmstart'), save_every=1, keep=1, async_save=False)
    restored = ckpt.restore(abstract({'params': params}))
    if restored is not None:
      ckpt.close()
      return restored.state['params']
    if c.init_checkpoint:
      raise FileNotFoundError(f'init_checkpoint={c.init_checkpoint!r} has no warmstart/ checkpoint')
    params, _ = sft.train(params, self._trainer(c.sft.optimizer, c.sft.steps), self.tok,
                          self.env.demonstrations(c.sft.hint_fraction), steps=c.sft.steps,
                          batch_size=c.sft.batch_size, seq_len=c.sampler.max_len, seed=c.seed, log=log)
    ckpt.save(0, {'params': params}, force=True)
    ckpt.close()
    return params

  def fresh_state(self, params) -> RLState:
    """RL's state at step 0 from the warm-start params."""
    train = self.trainer.start(params)
    self.step = self.trainer.step_fn(self.loss, self.batch_shardings)
    return RLState(train, teacher_lib.TeacherWeights(self.c.teacher.kind, train.params, self.c.teacher.ema_decay))

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
  def _start(self, ckpt: Checkpointer) -> tuple[RLState, int]:
    """(state, last step done): the warm start, or the newest checkpoint of this workdir."""
    with open(os.path.join(self.workdir, 'warmstart.jsonl'), 'a') as sft_log:
      params = self.warm_start(lambda i, row: sft_log.write(json.dumps(row) + '\n'))
    state = self.fresh_state(params)
    restored = ckpt.restore(abstract(state.checkpoint_tree()))
    if restored is None:
      return state, 0
    saved = restored.state
    state.teacher.fixed = None if state.teacher.kind == 'live' else saved['teacher']
    return RLState(step_lib.TrainState(state.train.step, saved['params'], saved['opt_state']), state.teacher), restored.step

  def _before(self, params, eval_tasks) -> dict:
    """The evaluation before RL and, per rule, the eval tasks it fired on (once per workdir)."""
    path = os.path.join(self.workdir, 'eval_before.json')
    if os.path.exists(path):
      with open(path) as f:
        return json.load(f)
    row, trajs = self._eval_row(params, eval_tasks, {})
    fired = {name: [] for name in self.critic.names}
    for i, t in enumerate(trajs):
      for rule in {fb.rule for fb in self.critic(t)}:
        fired[rule].append(i)
    before = {'row': row, 'fired': fired,
              'by_rule': {k: float(np.mean([trajs[i].success for i in v])) if v else None
                          for k, v in fired.items()}}
    if jax.process_index() == 0:
      with open(path, 'w') as f:
        json.dump(before, f)
    return before

  def _summary(self, params, eval_tasks, before: dict) -> dict:
    """The final evaluation against the one before RL, per rule; also written to summary.json."""
    r, fired = self.c.rl, before['fired']
    after, _ = self._eval_row(params, eval_tasks, fired, prefix='final')
    summary = {
        'before': before['row']['eval_success'], 'after': after['final_success'],
        'by_rule': {k: {'tasks': len(fired[k]), 'before': before['by_rule'][k],
                        'after': after.get(f'final/{k}/success')} for k in fired},
        'steps': r.steps, 'rollouts': r.steps * self.batch_rows, 'eval_tasks': len(eval_tasks),
    }
    if jax.process_index() == 0:
      with open(os.path.join(self.workdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    return summary

  def run(self) -> dict:
    c, r = self.c, self.c.rl
    ckpt = Checkpointer(os.path.join(self.workdir, 'checkpoints'), save_every=c.checkpoint_every, keep=2,
                        config=configs.to_dict(c))
    state, start = self._start(ckpt)
    writer = MetricsWriter(self.workdir, total_steps=r.steps, tensorboard=c.tensorboard, console=False)
    if start:
      writer.truncate(start)
    erng = np.random.default_rng([c.seed, 1])
    eval_tasks = [self.env.sample_task(erng) for _ in range(c.eval.num_tasks)]
    before = self._before(state.params, eval_tasks)
    if start == 0:
      writer.write(0, {**before['row'], 'rollouts': 0})
    bar = tqdm.tqdm(total=r.steps, initial=start, desc='rl', unit='step')
    masked = MaskCount(r.max_mask_rate, r.mask_rate_after)
    pool, pending = futures.ThreadPoolExecutor(1, thread_name_prefix='sampler') if r.staleness else None, {}
    stream = self.group_stream(first_gid=start * r.tasks_per_step) if r.stream else None
    for step in range(start + 1, r.steps + 1):
      t0 = time.perf_counter()
      ro = (self.streamed(step, state.params, stream) if stream
            else self._ahead(step, state.params, pending, pool))
      state, row = self.train_step(step, state, ro)
      row['time_step'] = time.perf_counter() - t0  # Wall time: sampling ahead overlaps the rest.
      row['rollouts'] = step * self.batch_rows
      masked.add(row['env_faults'], self.batch_rows, ro.taken.dropped if ro.taken else 0)
      if step % c.eval.every == 0 or step == r.steps:
        row.update(self._eval_row(state.params, eval_tasks, before['fired'])[0])
      writer.write(step, row)
      masked.check(step)
      bar.update(1)
      bar.set_postfix(success=f'{row["success_rate"]:.2f}', tok_s=f'{row["rollout_tokens_per_s"]:.0f}',
                      fb=int(row['feedback_count']),
                      kl=f'{row["distill_kl"]:.3f}', eval=f'{row.get("eval_success", float("nan")):.2f}')
      ckpt.save(step, state.checkpoint_tree(), force=step == r.steps)
    bar.close()
    if pool:
      pool.shutdown()
    if stream:
      stream.close()
    ckpt.close()
    writer.close()
    self.state = state
    return self._summary(state.params, eval_tasks, before)

  # -------------------------------------------------------------------------------------------
  def _ahead(self, step: int, params, pending: dict, pool: futures.Executor | None) -> Rollouts:
    """The rollouts of `step`. With rl.staleness = s > 0 the sampler runs ahead on a thread: the
    samples of steps step..step+s not yet started start now with the current params, so sampling
    overlaps the updates and a step trains on rollouts of params up to s updates old (the update's
    truncated importance weights correct for it; the recorded routes are replayed as sampled).
    Governance sees each step's samples on this thread, in step order (`critiqued`)."""
    if pool is None:
      return self.rollouts(step, params)
    snapshot = None
    for k in range(step, min(step + self.c.rl.staleness, self.c.rl.steps) + 1):
      if k not in pending:
        snapshot = snapshot or jax.tree.map(jnp.copy, params)  # The update donates the live params.
        pending[k] = pool.submit(self.sample, k, snapshot)
    return self.critiqued(step, pending.pop(step).result())

  def train_step(self, step: int, state: RLState, ro: Rollouts) -> tuple[RLState, dict[str, float]]:
    """Rewards and feedback of the step's rollouts, then (unless nothing carries a gradient) one update."""
    row = self._rollout_row(ro)
    row.update(self.gov.step(step, ro.trajs, ro.valid, ro.all_feedback, state.params,
                             state.teacher.params(state.params),
                             jax.random.fold_in(jax.random.key(self.c.seed * 1_000_003 + step), 1)))
    if not ro.active.any():  # Every group tied and no feedback: no gradient this step.
      row.update(time_teacher=0.0, time_update=0.0)
      return state, row
    state, update_row = self._update(ro, state)
    return state, {**row, **update_row}

  def rollouts(self, step: int, params) -> Rollouts:
    """The step's rollouts, sampled and critiqued."""
    return self.critiqued(step, self.sample(step, params))

  def sample(self, step: int, params) -> Sampled:
    """The step's tasks, G rollouts each, their rewards and advantages (no governance state)."""
    c, r = self.c, self.c.rl
    rng = np.random.default_rng([c.seed, 2, step])
    self.env.at_step(step)  # Drift (e.g. toolcalc's renames).
    tasks = [self.env.sample_task(rng) for _ in range(r.tasks_per_step)]
    tasks = [t for t in tasks for _ in range(r.group_size)]
    groups = np.repeat(np.arange(r.tasks_per_step), r.group_size)
    episodes = [self.env.reset(t) for t in tasks]
    trajs, st = self.sampler.rollout(params, episodes, jax.random.key(c.seed * 1_000_003 + step),
                                     tasks=tasks, groups=groups)
    return self._scored(trajs, groups, st, episodes, rng)

  def group_stream(self, first_gid: int = 0) -> groups_lib.GroupStream:
    """rl.stream's rollouts: the sampler's batch as a Stream fed one group (task) at a time."""
    c, r = self.c, self.c.rl

    def new_group(gid: int):
      task = self.env.sample_task(np.random.default_rng([c.seed, 3, gid]))
      keys = episode_keys(jax.random.fold_in(jax.random.key(c.seed * 1_000_003), gid), r.group_size)
      return [self.env.reset(task) for _ in range(r.group_size)], [task] * r.group_size, keys
    stream = Stream(self.sampler, self.batch_rows, wait_s=r.stream_wait_s)
    return groups_lib.GroupStream(stream, new_group, r.stream_max_staleness, first_gid)

  def streamed(self, step: int, params, stream: groups_lib.GroupStream) -> Rollouts:
    """rl.stream: the first tasks_per_step groups to finish with the params of update step - 1,
    critiqued (the loop module docstring)."""
    self.env.at_step(step)  # Drift: groups begun from now on see it.
    taken = stream.take(params, step - 1, self.c.rl.tasks_per_step)
    members = [e for g in taken.groups for e in g.members]
    groups = np.repeat(np.arange(len(taken.groups)), self.c.rl.group_size)
    s = self._scored([e.traj for e in members], groups, taken.stats, [e.episode for e in members],
                     np.random.default_rng([self.c.seed, 2, step]), taken)
    return self.critiqued(step, s)

  def _scored(self, trajs, groups, stats, episodes, rng, taken=None) -> Sampled:
    """Rollouts with their rewards and group-baseline advantages (faults masked)."""
    valid = np.array([t.fault is None for t in trajs])
    rewards = np.array([t.reward for t in trajs])
    adv = losses.group_advantages(rewards, groups, valid, std_norm=self.c.loss.std_norm)
    return Sampled(trajs, groups, stats, valid, rewards, adv, self.env.metrics(episodes), rng, taken)

  def critiqued(self, step: int, s: Sampled) -> Rollouts:
    """The governed feedback of sampled rollouts, the distillation targets and the rows with a
    gradient (on the main thread: governance decides in step order)."""
    r, lc = self.c.rl, self.c.loss
    t0 = time.perf_counter()
    feedback, every = self.gov.critique(step, s.trajs)
    targets = feedback if lc.distill_coef > 0 else []
    if len(targets) > r.max_targets:  # A fixed number of distillation slots (one compiled shape).
      keep = np.sort(s.rng.choice(len(targets), r.max_targets, replace=False))
      targets = [targets[k] for k in keep]
    active = (s.adv != 0) & s.valid if lc.pg_coef else np.zeros(len(s.trajs), bool)
    active[[i for i, _ in targets]] = True
    return Rollouts(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)}, feedback=feedback,
                    all_feedback=every, targets=targets, active=active,
                    time_critic=time.perf_counter() - t0)

  def _rollout_row(self, ro: Rollouts) -> dict[str, float]:
    """The step's log row before the update: rewards, feedback, sampling statistics."""
    st, trajs, valid = ro.stats, ro.trajs, ro.valid
    row = {'reward_mean': float(ro.rewards[valid].mean()) if valid.any() else 0.0,
           'success_rate': float(np.mean([t.success for t in trajs if t.fault is None] or [0.0])),
           'feedback_count': len(ro.feedback),
           'targets_dropped': len(ro.feedback) - len(ro.targets) if self.c.loss.distill_coef else 0,
           'env_faults': st.faults, 'mask_rate': st.faults / max(len(trajs), 1), 'truncated': st.truncated,
           'obs_truncated': st.obs_truncated, 'malformed_tokens': st.malformed_tokens,
           'rollout_tokens_per_s': st.new_tokens / max(st.sample_s, 1e-9),
           'policy_tokens': float(np.mean([t.num_policy_tokens for t in trajs])),
           'time_sample': st.sample_s, 'time_env': st.env_s, 'time_critic': ro.time_critic,
           'time_push': st.push_s, 'routes_replayed': float(self.replay_routes),
           'rows_trained': int(ro.active.sum()), 'update_rows': 0,
           'pg_loss': 0.0, 'distill_loss': 0.0, 'distill_kl': 0.0, 'hint_overflow': 0, **ro.env_metrics}
    if ro.taken is not None:
      carried = ro.taken.staleness_B[ro.taken.staleness_B > 0]
      row.update(episodes_carried=len(carried), staleness_mean=float(carried.mean()) if len(carried) else 0.0,
                 episodes_running=ro.taken.running, stale_dropped=ro.taken.dropped)
    for name in self.critic.names:
      idx = [i for i, fb in ro.feedback if fb.rule == name]
      row[f'rule/{name}/fires'] = len(idx)
      grp = {int(ro.groups[i]) for i in idx}
      if grp:
        row[f'rule/{name}/group_success'] = float(np.mean([trajs[i].success for i in range(len(trajs))
                                                           if int(ro.groups[i]) in grp]))
    return row

  def _batch(self, ro: Rollouts) -> tuple[dict[str, np.ndarray], Place]:
    """The rows of the update: the rollouts packed into rows of max_len (one segment each; with
    rl.row_buckets = 0 one per row), as many rows as the fewest of self.row_counts that hold them.
    Returns (rows, each rollout's place)."""
    seq, trajs = self.c.sampler.max_len, ro.trajs
    place = pack([len(t.tokens) for t in trajs], seq) if self.c.rl.row_buckets else one_per_row(len(trajs))
    b = next(n for n in self.row_counts if n > max(r for r, _ in place))
    rows = to_batch(trajs, seq, self.tok.pad_id, place, b)
    rows['adv'] = np.zeros((b, seq), np.float32)  # Per token: a row holds several rollouts.
    rows['valid'] = np.zeros(b, np.float32)       # Valid rollouts per row: their sum normalises the loss.
    for i, (r, o) in enumerate(place):
      end = o + min(len(trajs[i].tokens), seq)
      if ro.valid[i]:
        rows['adv'][r, o:end] = ro.adv[i]
        rows['valid'][r] += 1
      else:
        rows['mask'][r, o:end] = 0
    if self.replay_routes:
      rows['routes'] = routes_batch(trajs, seq, b, self.cfg.num_moe_layers, self.cfg.num_experts_per_tok, place)
    return rows, place

  def _compiled(self, name: str, fn: step_lib.MeshJit, rows: int, args_at: Callable[[int], tuple]):
    """fn's executable for `rows` rows of the update. Its first call compiles fn for every count of
    self.row_counts (`args_at(n)`: its arguments with n rows, abstract or not), so that no later
    step compiles whatever its rows."""
    if (name, rows) not in self._programs:
      for n in self.row_counts:
        self._programs[name, n] = fn.lower(*args_at(n)).compile()
    return self._programs[name, rows]

  def update_batch(self, ro: Rollouts, teacher_params) -> tuple[dict, teacher_lib.Targets]:
    """The train step's batch: rows, distillation targets with the teacher's hidden states (and the
    anchor's), the teacher's head. Returns (batch, targets)."""
    c = self.c
    rows, place = self._batch(ro)
    tg = teacher_lib.build_targets(self.tok, ro.trajs, ro.targets, dict(enumerate(place)),
                                   c.sampler.max_len, c.sampler.max_turn_tokens, c.rl.max_targets)
    if tg.feedback:
      t_hidden = self.teacher_fn(teacher_params, tg.t_tokens, tg.t_seg, tg.t_pos)
    else:
      t_hidden = np.zeros((*tg.d_tok.shape, self.cfg.d_model), jnp.dtype(self.cfg.dtype))
    if self.lc.anchor_coef:
      ids = lambda n: jax.ShapeDtypeStruct((n, c.sampler.max_len), np.int32)
      ref = self._compiled('reference', self.reference_fn, len(rows['tokens']),
                           lambda n: (teacher_params, ids(n), ids(n)))
      rows['ref_hidden'] = ref(teacher_params, rows['tokens'], rows['segment_ids'])
    targets = {'d_row': tg.d_row, 'd_pos': tg.d_pos, 'd_tok': tg.d_tok, 'd_mask': tg.d_mask, 't_hidden': t_hidden}
    return {'rows': rows, 'targets': targets, 'teacher_head': teacher_params['lm_head']['kernel']}, tg

  def _update(self, ro: Rollouts, state: RLState) -> tuple[RLState, dict[str, float]]:
    """The teacher pass on the hinted contexts, then one train step; its part of the log row."""
    t0 = time.perf_counter()
    batch, tg = self.update_batch(ro, state.teacher.params(state.params))
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    b = len(batch['rows']['tokens'])

    def args_at(n: int) -> tuple:  # Abstract: numpy leaves do not lower split over several processes.
      shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
      rows = {k: jax.ShapeDtypeStruct((n, *v.shape[1:]), v.dtype) for k, v in batch['rows'].items()}
      return state.train, {**jax.tree.map(shape, batch), 'rows': rows}, None
    step = self._compiled('step', self.step, b, args_at)
    train, m = step(state.train, self.trainer.put_global(batch, self.batch_shardings), None)
    state.teacher.update(train.params)
    m = jax.device_get(m)
    kl_N = m.pop('kl_N')[:len(tg.feedback)]
    row = {k: float(v) for k, v in m.items()}
    row.update(time_teacher=t1 - t0, time_update=time.perf_counter() - t1, hint_overflow=tg.overflow,
               distill_kl=float(kl_N.mean()) if len(kl_N) else 0.0, update_rows=b)
    for name in self.critic.names:
      ks = [k for k, (_, fb) in zip(kl_N, tg.feedback) if fb.rule == name]
      if ks:
        row[f'rule/{name}/kl'] = float(np.mean(ks))
    return RLState(train, state.teacher), row


def row_counts(rollouts: int, buckets: int, multiple: int) -> list[int]:
  """The update's row counts: `buckets` equal steps up to one row per rollout, each rounded up to a
  multiple of `multiple` (the devices that split rows; it divides `rollouts`). 0 buckets: one count,
  a row per rollout."""
  up = lambda n, m: -(-n // m) * m  # n rounded up to a multiple of m.
  return sorted({up(-(-rollouts * k // buckets), multiple) for k in range(1, buckets + 1)} or {rollouts})


class MaskRateError(RuntimeError):
  """Too many episodes masked (rl.max_mask_rate): the harness fails, or the policy breaks it."""


@dataclasses.dataclass
class MaskCount:
  """The run's unscored episodes against rl.max_mask_rate: masked (environment faults) and, with
  rl.stream, dropped as stale. Both escape a reward, so a policy that breaks the harness or stalls
  its episodes until their group is dropped escapes its failures alike."""
  limit: float
  after: int                        # Episodes before the rate is judged.
  masked: int = 0                   # Unscored: faults and stale drops.
  dropped: int = 0                  # Of them, dropped as stale.
  episodes: int = 0

  def add(self, masked: int, episodes: int, dropped: int = 0) -> None:
    self.masked += masked + dropped
    self.dropped += dropped
    self.episodes += episodes + dropped

  def check(self, step: int) -> None:
    rate = self.masked / max(self.episodes, 1)
    if self.episodes >= self.after and rate > self.limit:
      stale = (f' or dropped as stale ({self.dropped}: their groups ran past rl.stream_max_staleness)'
               if self.dropped else '')
      raise MaskRateError(
          f'step {step}: {self.masked} of {self.episodes} episodes masked ({rate:.1%}) by '
          f'environment faults{stale}, above rl.max_mask_rate={self.limit:.1%}; an unscored episode '
          'gets no reward, so a policy that breaks the harness or stalls escapes its failures: see '
          'the rows\' env_faults and stale_dropped and the trajectories\' fault in metrics.jsonl '
          'before resuming')


def run(config: RLExperimentConfig, workdir: str) -> dict:
  return Runner(config, workdir).run()
