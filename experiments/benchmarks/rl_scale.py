"""RL at scale (issue 14): a mesh against one device, update memory against context, the async pipeline.

python -m experiments.benchmarks.rl_scale --json=/tmp/rl_scale.json
python -m experiments.benchmarks.rl_scale --json=/tmp/rl_scale.json --parts=sharded,memory   # the cheap ones

sharded: the tiny toolcalc RL setup from one random init on 8 simulated devices (mesh
  data:2,fsdp:2,expert:2) and on 1, same keys: `rollouts_identical` (every token), then on those
  rollouts the teacher pass, the RL objective and its gradients: `sharded_max_abs_diff` (max over the
  objective and every gradient leaf).
memory: `temp_bytes` of one compiled RL update (forward, backward, optimizer; XLA memory_analysis) on
  the toolcalc tiny model at 1k..64k tokens per trajectory, `chunked` (loss.logit_chunk) and
  `current` (the whole sequence's logits at once), both with the model's configured attention.
async: `async_speedup`, rollouts per second of toolcalc RL runs with rl.staleness=1 over 0 from one
  warm start; `final_success` of each over --seeds seeds (mean, std).
"""

import dataclasses
import functools
import json
import os
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments import toolcalc_rl
from research import configs
from research.model import transformer
from research.parallel import distributed
from research.parallel import mesh as mesh_lib
from research.rl import loop
from research.train import step as step_lib

_JSON = flags.DEFINE_string('json', None, 'Also write the numbers here.')
_PARTS = flags.DEFINE_list('parts', ['sharded', 'memory', 'async'], 'Which parts to run.')
_CONTEXTS = flags.DEFINE_list('contexts', ['1024', '4096', '16384', '65536'], 'Tokens per trajectory (memory).')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per arm (async).')
_STEPS = flags.DEFINE_integer('steps', 12, 'RL steps per run (async).')
_SFT_STEPS = flags.DEFINE_integer('sft_steps', 300, 'Warm-start steps shared by the runs (async).')
_EVAL_TASKS = flags.DEFINE_integer('eval_tasks', 64, 'Held-out tasks of final_success (async).')
_INIT = flags.DEFINE_string('init_checkpoint', '', 'A workdir with warmstart/ (async); empty: warm start here.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/rl_scale_bench', 'Scratch workdir.')


def tiny(mesh: str = 'data:1') -> ml_collections.ConfigDict:
  """The toolcalc RL config shrunk to test size: 4 tasks x 2 rollouts, routes replayed."""
  c = toolcalc_rl.get_config()
  m = c.model
  m.d_model, m.head_dim, m.num_heads, m.num_kv_heads, m.d_expert, m.num_experts = 32, 16, 2, 1, 32, 4
  c.rl.tasks_per_step, c.rl.group_size, c.rl.max_targets, c.sampler.record_routes = 4, 2, 8, True
  c.sampler.max_turns, c.sampler.max_turn_tokens, c.sampler.max_len = 3, 12, 96
  c.env.max_ops, c.tensorboard, c.mesh = 1, False, mesh
  c.critic.rules = ('unknown_tool', 'wrong_tool', 'malformed_call')  # An untrained model is malformed.
  return c


def _objective_and_grads(config, workdir: str):
  """Rollouts of step 1 from the init, then the objective (+ router losses) and its gradients."""
  r = loop.Runner(config, workdir)
  state = r.fresh_state(r.trainer.init(jax.random.key(0)).params)
  ro = r.rollouts(1, state.params)
  batch, _ = r.update_batch(ro, state.teacher.params(state.params))

  def total(params, batch):
    value, aux = r.loss(params, batch, r.cfg)
    return value + step_lib.router_loss(aux, r.cfg)
  fn = r.trainer.jit(jax.value_and_grad(total), in_shardings=(r.trainer.param_shardings, r.batch_shardings))
  value, grads = jax.device_get(fn(state.params, batch))
  return [t.tokens for t in ro.trajs], value, grads


def sharded(workdir: str, mesh: str = 'data:2,fsdp:2,expert:2') -> dict:
  toks1, v1, g1 = _objective_and_grads(tiny(), os.path.join(workdir, 'one'))
  toks8, v8, g8 = _objective_and_grads(tiny(mesh), os.path.join(workdir, 'mesh'))
  diffs = [abs(float(v1) - float(v8))] + [float(np.max(np.abs(a - b))) for a, b in
                                          zip(jax.tree.leaves(g1), jax.tree.leaves(g8))]
  return {'mesh': mesh, 'rollouts_identical': toks1 == toks8, 'sharded_max_abs_diff': max(diffs),
          'objective': float(v1), 'rollout_tokens': sum(map(len, toks1))}


def update_temp_bytes(cfg, context: int, chunk: int, targets: int = 4, span: int = 256) -> int:
  """XLA's temp bytes of one RL update (1 trajectory of `context` tokens, anchor and routes on)."""
  lc = loop.LossConfig(logit_chunk=chunk)
  trainer = step_lib.Trainer(cfg, optax.adamw(1e-3), mesh_lib.make_mesh({'data': 1}))
  fn = functools.partial(step_lib.train_step, cfg=cfg, tx=trainer.tx,
                         loss=functools.partial(loop.objective, lc=lc, temperature=1.0))
  sds = jax.ShapeDtypeStruct
  params = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  state = step_lib.TrainState(sds((), jnp.int32), params, jax.eval_shape(trainer.tx.init, params))
  t, i32, f32 = (1, context), jnp.int32, jnp.float32
  rows = {'tokens': sds(t, i32), 'segment_ids': sds(t, i32), 'targets': sds(t, i32), 'mask': sds(t, f32),
          'sampler_logp': sds(t, f32), 'adv': sds((1,), f32), 'valid': sds((1,), f32),
          'ref_hidden': sds((*t, cfg.d_model), jnp.dtype(cfg.dtype)),
          'routes': sds((*t, cfg.num_moe_layers, cfg.num_experts_per_tok), i32)}
  tgt = {k: sds((targets, span), i32) for k in ('d_pos', 'd_tok')}
  tgt.update(d_row=sds((targets,), i32), d_mask=sds((targets, span), f32),
             t_hidden=sds((targets, span, cfg.d_model), jnp.dtype(cfg.dtype)))
  batch = {'rows': rows, 'targets': tgt, 'teacher_head': params['lm_head']['kernel']}
  with jax.set_mesh(trainer.mesh):
    compiled = jax.jit(trainer.with_rules(fn)).lower(state, batch, None).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def memory(contexts: list[int], chunk: int) -> dict:
  """chunked: logit_chunk positions at a time, blockwise attention; current: the whole sequence's
  logits and XLA's dense attention (the path before issue 14)."""
  cfg = configs.from_dict(loop.RLExperimentConfig, toolcalc_rl.get_config()).model
  paths = {'chunked': (dataclasses.replace(cfg, attention_impl='blockwise'), chunk),
           'current': (dataclasses.replace(cfg, attention_impl='xla'), 0)}
  out = {}
  for n in contexts:
    out[str(n)] = {name: update_temp_bytes(c, n, k) for name, (c, k) in paths.items()}
    print(f'context {n}: temp bytes {out[str(n)]}', flush=True)
  return {'temp_bytes': out, 'logit_chunk': chunk, 'attention_block': cfg.attention_block,
          'vocab_size': cfg.vocab_size}


def _run(staleness: int, seed: int, workdir: str, warm: str, steps: int, eval_tasks: int) -> dict:
  c = toolcalc_rl.get_config()
  c.seed, c.rl.staleness, c.rl.steps, c.init_checkpoint, c.tensorboard = seed, staleness, steps, warm, False
  c.eval.every, c.eval.num_tasks = 10 ** 6, eval_tasks
  r = loop.Runner(c, workdir)
  t0 = time.perf_counter()
  summary = r.run()
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(l) for l in f]
  steps_s = [row['time_step'] for row in rows if row['step'] > 1]  # Step 1 compiles.
  return {'final_success': summary['after'], 'wall_s': time.perf_counter() - t0,
          'rollouts_per_s': r.batch_rows * len(steps_s) / sum(steps_s), 'rollouts': summary['rollouts']}


def pipeline(workdir: str, seeds: int, steps: int, sft_steps: int, eval_tasks: int, init: str) -> dict:
  """Both arms from one warm start (made once): rollouts per second over the RL steps after the
  first (wall time, evaluation excluded), and the final held-out success."""
  warm = init or os.path.join(workdir, 'warm')
  if not init:
    c = toolcalc_rl.get_config()
    c.sft.steps, c.tensorboard = sft_steps, False
    loop.Runner(c, warm).warm_start(lambda i, row: None)
  arms = {}
  for name, staleness in (('sync', 0), ('async', 1)):
    arms[name] = [_run(staleness, s, os.path.join(workdir, f'{name}_{s}'), warm, steps, eval_tasks)
                  for s in range(seeds)]
  rate = {k: float(np.mean([a['rollouts_per_s'] for a in v])) for k, v in arms.items()}
  return {'async_speedup': float(rate['async'] / rate['sync']), 'rollouts_per_s': rate,
          'final_success': {k: {'mean': float(np.mean([a['final_success'] for a in v])),
                                 'std': float(np.std([a['final_success'] for a in v])),
                                 'seeds': [a['final_success'] for a in v]} for k, v in arms.items()},
          'runs': arms}


def main(argv):
  del argv
  out = {}
  if 'sharded' in _PARTS.value:
    out.update(sharded(os.path.join(_WORKDIR.value, 'sharded')))
    print({k: out[k] for k in ('rollouts_identical', 'sharded_max_abs_diff')}, flush=True)
  if 'memory' in _PARTS.value:
    out.update(memory([int(n) for n in _CONTEXTS.value], loop.LossConfig().logit_chunk))
  if 'async' in _PARTS.value:
    out.update(pipeline(os.path.join(_WORKDIR.value, 'async'), _SEEDS.value, _STEPS.value, _SFT_STEPS.value,
                        _EVAL_TASKS.value, _INIT.value))
    print({k: out[k] for k in ('async_speedup', 'final_success')}, flush=True)
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(out, f, indent=1, default=float)


if __name__ == '__main__':
  distributed.simulate_cpu_devices(8)
  app.run(main)
