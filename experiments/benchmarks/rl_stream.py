"""RL steps with a straggler: batch rollouts vs streaming (rl.stream), side by side in one run.

python -m experiments.benchmarks.rl_stream [--steps=8] [--delay=1.0] [--json=/tmp/rl_stream.json]

A tiny toolcalc RL run (experiments/toolcalc_rl.py with a small model, random init) in which one
episode of every rl-batch's worth (every tasks_per_step * group_size-th reset) is a straggler: each
of its messages waits --delay seconds in its environment, as a slow sandboxed command would. The
same Runner times --steps RL steps (rollouts, critique, update) each way after one step that
compiles: batch mode (each step samples its own batch and waits for its straggler) and streaming
(updates take the first groups to finish; the straggler's group carries over, or is dropped past
rl.stream_max_staleness). Reports steps/s, trained episodes/s, and what streaming carried,
dropped and how stale it was.
"""

import json
import os
import tempfile
import time

from absl import app, flags
import jax
import numpy as np

from experiments import toolcalc_rl
from research.rl import loop

_STEPS = flags.DEFINE_integer('steps', 8, 'RL steps timed per mode.')
_DELAY = flags.DEFINE_float('delay', 1.0, "Seconds each of a straggler's messages waits in its environment.")
_MAX_STALENESS = flags.DEFINE_integer('max_staleness', 2, 'rl.stream_max_staleness.')
_JSON = flags.DEFINE_string('json', None, 'Also write the report here.')


def _config(max_staleness: int):
  c = toolcalc_rl.get_config()
  m = c.model
  m.d_model, m.head_dim, m.num_heads, m.num_kv_heads, m.d_expert, m.num_experts = 32, 16, 2, 1, 32, 4
  c.rl.tasks_per_step, c.rl.group_size, c.rl.stream_max_staleness = 4, 4, max_staleness
  c.sampler.max_turns, c.sampler.max_turn_tokens, c.sampler.max_len = 3, 12, 96
  c.optimizer.warmup_steps, c.tensorboard = 0, False
  c.env.toolcalc.max_ops = 1
  c.critic.rules = ('unknown_tool', 'wrong_tool', 'malformed_call')
  return c


def _with_stragglers(env, every: int, delay: float) -> None:
  """Makes every `every`-th episode env.reset starts slow: `delay` seconds per message."""
  reset, count = env.reset, [0]

  def reset_with_stragglers(task):
    ep = reset(task)
    count[0] += 1
    if count[0] % every == 1:
      step = ep.step
      ep.step = lambda message: (time.sleep(delay), step(message))[1]
    return ep
  env.reset = reset_with_stragglers


def _time(r: loop.Runner, state, steps: int, stream) -> tuple[dict, object]:
  """`steps` RL steps after one that compiles; batch mode when `stream` is None."""
  rows = []
  for step in range(1, steps + 2):
    if step == 2:
      t0 = time.perf_counter()
    ro = r.streamed(step, state.params, stream) if stream else r.rollouts(step, state.params)
    state, row = r.train_step(step, state, ro)
    rows.append(row)
  seconds = time.perf_counter() - t0
  out = {'seconds': round(seconds, 2), 'steps_per_s': round(steps / seconds, 3),
         'episodes_per_s': round(steps * r.batch_rows / seconds, 2),
         'time_sample_mean': round(float(np.mean([x['time_sample'] + x['time_env'] for x in rows[1:]])), 3),
         'time_update_mean': round(float(np.mean([x['time_update'] for x in rows[1:]])), 3)}
  if stream:
    out.update(carried=int(sum(x['episodes_carried'] for x in rows[1:])),
               staleness_mean=round(float(np.mean([x['staleness_mean'] for x in rows[1:] if x['episodes_carried']]
                                                  or [0.0])), 2),
               stale_dropped=int(sum(x['stale_dropped'] for x in rows[1:])), running_at_end=rows[-1]['episodes_running'])
  return out, state


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(prefix='rl-stream-') as tmp:
    r = loop.Runner(_config(_MAX_STALENESS.value), tmp)
    _with_stragglers(r.env, r.batch_rows, _DELAY.value)
    params = r.trainer.init(jax.random.key(0)).params
    report = {'cpus': os.cpu_count(), 'devices': jax.device_count(), 'batch_rows': r.batch_rows,
              'delay_s': _DELAY.value, 'steps': _STEPS.value, 'max_staleness': _MAX_STALENESS.value}
    report['batch'], _ = _time(r, r.fresh_state(jax.tree.map(np.array, params)), _STEPS.value, None)
    stream = r.group_stream()
    report['stream'], _ = _time(r, r.fresh_state(jax.tree.map(np.array, params)), _STEPS.value, stream)
    stream.close()
  report['stream_vs_batch_steps_per_s'] = round(report['stream']['steps_per_s'] / report['batch']['steps_per_s'], 2)
  print(json.dumps(report, indent=1))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(report, f, indent=1)


if __name__ == '__main__':
  app.run(main)
