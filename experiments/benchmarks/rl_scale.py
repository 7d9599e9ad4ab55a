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
gpu_update: seconds of one RL update of one trajectory of --gpu_context tokens on the tiny MoE
  widened to fill a device (run on a GPU; `gpu_suite.sh`'s `rl` part).
async: `async_speedup`, rollouts per second of toolcalc RL runs with rl.staleness=1 over 0 from one
  warm start; `final_success` of each over --seeds seeds (mean, std).
"""

import argparse
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

from experiments import toolcalc_rl
from research import configs
from research.model import attention
from research.model import moe
from research.model import transformer
from research.parallel import distributed
from research.parallel import mesh as mesh_lib
from research.rl import loop
from research.train import step as step_lib
from research.rl import config as rl_config
from research.rl.update import objective


def tiny(mesh: str = 'data:1') -> ml_collections.ConfigDict:
  """The toolcalc RL config shrunk to test size: 4 tasks x 2 rollouts, routes replayed."""
  c = toolcalc_rl.get_config()
  m = c.model
  m.d_model, m.head_dim, m.num_heads, m.num_kv_heads, m.d_expert, m.num_experts = 32, 16, 2, 1, 32, 4
  c.rl.tasks_per_step, c.rl.group_size, c.rl.max_targets, c.sampler.record_routes = 4, 2, 8, True
  c.sampler.max_turns, c.sampler.max_turn_tokens, c.sampler.max_len = 3, 12, 96
  c.env.toolcalc.max_ops, c.tensorboard, c.mesh = 1, False, mesh
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


def update_program(cfg, context: int, chunk: int, targets: int = 4, span: int = 256):
  """One RL update (1 trajectory of `context` tokens, anchor and routes on): (jitted step, abstract
  state, abstract batch, trainer)."""
  lc = rl_config.LossConfig(logit_chunk=chunk)
  trainer = step_lib.Trainer(cfg, optax.adamw(1e-3), mesh_lib.make_mesh({'data': 1}))
  fn = functools.partial(step_lib.train_step, cfg=cfg, tx=trainer.tx,
                         loss=functools.partial(objective.objective, lc=lc, temperature=1.0))
  sds = jax.ShapeDtypeStruct
  params = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  state = step_lib.TrainState(sds((), jnp.int32), params, jax.eval_shape(trainer.tx.init, params))
  t, i32, f32 = (1, context), jnp.int32, jnp.float32
  rows = {'tokens': sds(t, i32), 'segment_ids': sds(t, i32), 'targets': sds(t, i32), 'mask': sds(t, f32),
          'sampler_logp': sds(t, f32), 'adv': sds(t, f32), 'valid': sds((1,), f32),
          'ref_hidden': sds((*t, cfg.d_model), jnp.dtype(cfg.dtype)),
          'routes': sds((*t, cfg.num_moe_layers, cfg.num_experts_per_tok), i32)}
  tgt = {k: sds((targets, span), i32) for k in ('d_pos', 'd_tok')}
  tgt.update(d_row=sds((targets,), i32), d_mask=sds((targets, span), f32),
             t_hidden=sds((targets, span, cfg.d_model), jnp.dtype(cfg.dtype)))
  batch = {'rows': rows, 'targets': tgt, 'teacher_head': params['lm_head']['kernel']}
  return jax.jit(trainer.with_rules(fn), donate_argnums=0), state, batch, trainer


def update_temp_bytes(cfg, context: int, chunk: int) -> int:
  """XLA's temp bytes of one RL update (update_program)."""
  step, state, batch, trainer = update_program(cfg, context, chunk)
  with jax.set_mesh(trainer.mesh):
    return int(step.lower(state, batch, None).compile().memory_analysis().temp_size_in_bytes)


# The tiny MoE widened to fill one device (the GPU suite's train shape, experiments/benchmarks/gpu_kernels).
WIDE = dict(vocab_size=32768, d_model=2048, num_layers=8, num_heads=16, num_kv_heads=4, head_dim=128,
            num_experts=64, num_experts_per_tok=8, d_expert=768, dtype='bfloat16', moe_impl='auto',
            attention_impl='auto')


def gpu_update(context: int, chunk: int, shape: dict = WIDE) -> dict:
  """Seconds of one RL update of one `context`-token trajectory on the toolcalc model reshaped."""
  cfg = dataclasses.replace(configs.from_dict(rl_config.RLExperimentConfig, toolcalc_rl.get_config()).model, **shape)
  step, state, batch, trainer = update_program(cfg, context, chunk)
  rng = np.random.default_rng(0)

  def fill(x):
    if x.dtype == jnp.int32:
      high = cfg.num_experts if x.shape[-1:] == (cfg.num_experts_per_tok,) else min(context, cfg.vocab_size)
      return jnp.asarray(rng.integers(0, high, x.shape), jnp.int32)
    return jnp.asarray(rng.standard_normal(x.shape) * 0.1, x.dtype)
  batch = jax.tree.map(fill, batch)
  batch['rows'].update(segment_ids=jnp.ones((1, context), jnp.int32), mask=jnp.ones((1, context)),
                       valid=jnp.ones((1,)), adv=jnp.ones((1,)))
  with jax.set_mesh(trainer.mesh):
    state = trainer.init(jax.random.key(0))
    batch['teacher_head'] = jnp.copy(state.params['lm_head']['kernel'])  # The state is donated.
    times = []
    for _ in range(4):  # The first compiles.
      t0 = time.perf_counter()
      state, metrics = step(state, batch, None)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - t0)
  return {'gpu_update': {'context': context, 'device': jax.devices()[0].device_kind,
                         'seconds': float(np.median(times[1:])), 'compile_and_first_s': times[0],
                         'params': sum(x.size for x in jax.tree.leaves(state.params)),
                         'logit_chunk': chunk, 'attention_impl': attention.resolve_impl(cfg.attention_impl),
                         'moe_impl': moe.resolve_impl(cfg.moe_impl)}}


def memory(contexts: list[int], chunk: int) -> dict:
  """chunked: logit_chunk positions at a time, blockwise attention; current: the whole sequence's
  logits and XLA's dense attention (the path before issue 14)."""
  cfg = configs.from_dict(rl_config.RLExperimentConfig, toolcalc_rl.get_config()).model
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


def _args():
  """The command line (argparse: tests import this module next to absl-flag modules)."""
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--json', default=None, help='Also write the numbers here.')
  ap.add_argument('--parts', default='sharded,memory,async', help='Which parts to run (comma-separated).')
  ap.add_argument('--contexts', default='1024,4096,16384,65536', help='Tokens per trajectory (memory).')
  ap.add_argument('--seeds', type=int, default=3, help='Seeds per arm (async).')
  ap.add_argument('--steps', type=int, default=12, help='RL steps per run (async).')
  ap.add_argument('--sft_steps', type=int, default=300, help='Warm-start steps shared by the runs (async).')
  ap.add_argument('--eval_tasks', type=int, default=64, help='Held-out tasks of final_success (async).')
  ap.add_argument('--init_checkpoint', default='', help='A workdir with warmstart/ (async); empty: warm start here.')
  ap.add_argument('--workdir', default='/tmp/rl_scale_bench', help='Scratch workdir.')
  ap.add_argument('--gpu_context', type=int, default=32768, help='Tokens of the one trajectory (gpu_update).')
  return ap.parse_args()


def main():
  a = _args()
  parts, out = a.parts.split(','), {}
  if 'sharded' in parts:
    out.update(sharded(os.path.join(a.workdir, 'sharded')))
    print({k: out[k] for k in ('rollouts_identical', 'sharded_max_abs_diff')}, flush=True)
  if 'memory' in parts:
    out.update(memory([int(n) for n in a.contexts.split(',')], rl_config.LossConfig().logit_chunk))
  if 'async' in parts:
    out.update(pipeline(os.path.join(a.workdir, 'async'), a.seeds, a.steps, a.sft_steps, a.eval_tasks,
                        a.init_checkpoint))
    print({k: out[k] for k in ('async_speedup', 'final_success')}, flush=True)
  if 'gpu_update' in parts:
    out.update(gpu_update(a.gpu_context, rl_config.LossConfig().logit_chunk))
    print(out['gpu_update'], flush=True)
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(out, f, indent=1, default=float)


if __name__ == '__main__':
  distributed.simulate_cpu_devices(8)
  main()
