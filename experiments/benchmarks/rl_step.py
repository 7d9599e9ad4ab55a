"""RL sampler and step benchmark: KV-cache vs recompute generation, and where an RL step's time goes.

python -m experiments.benchmarks.rl_step --json=/tmp/rl_step.json
python -m experiments.benchmarks.rl_step --init_checkpoint=/tmp/toolcalc_rl   # reuse a warm start

1. Tokens/s generating 256 new tokens for a batch, side by side in one run: the sampler's cached
   decode loop (research/rl/rollout/sampler.py `generate`) vs a loop that recomputes the full forward over
   the whole buffer for every new token. Same model, batch, sampling; compile time excluded.
2. An RL step on toolcalc (experiments/toolcalc_rl.py), split into sampling, environment, critic,
   teacher pass and update; means over steps after the first two (which compile).
3. Warm-start batches: token slots per step with conversations packed into rows (research/rl/sft.py)
   vs one conversation per row padded to the longest (rounded up to 32), over the same 200 steps of
   demonstrations; a count, not a timing.
"""

import functools
import json
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import toolcalc_rl
from research.model import decode
from research.model import transformer
from research.model.config import ModelConfig
from research.rl import loop
from research.rl.rollout import sampler as sampler_lib
from research.rl import sft

_JSON = flags.DEFINE_string('json', None, 'Also write the numbers here.')
_BATCH = flags.DEFINE_integer('batch', 8, 'Rows generated at once.')
_NEW = flags.DEFINE_integer('new_tokens', 256, 'Tokens generated per row.')
_STEPS = flags.DEFINE_integer('steps', 6, 'RL steps to time.')
_INIT = flags.DEFINE_string('init_checkpoint', '', 'A workdir with warmstart/; empty: a short warm start.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/rl_step_bench', 'Scratch workdir.')
_SFT_STEPS = flags.DEFINE_integer('sft_steps', 150, 'Warm-start steps when no checkpoint is given.')


def _recompute_generate(params, buf_BxT, key, *, start: int, new: int, cfg, temperature):
  """Each new token runs the full forward over the whole buffer (no cache)."""
  def body(i, c):
    buf, key = c
    logits, _, _ = transformer.forward(params, buf, cfg)
    key, sub = jax.random.split(key)
    tok, _ = sampler_lib.sample_logits(jax.random.split(sub, buf.shape[0]), logits[:, start + i - 1], temperature)
    return buf.at[:, start + i].set(tok.astype(buf.dtype)), key
  return jax.lax.fori_loop(0, new, body, (buf_BxT, key))[0]


def bench_generation(cfg: ModelConfig, b: int, new: int, prompt: int = 32) -> dict:
  params = transformer.init(cfg, jax.random.key(0))
  s = sampler_lib.SamplerConfig(temperature=1.0, max_turn_tokens=new, max_len=prompt + new)
  toks = jax.random.randint(jax.random.key(1), (b, prompt), 0, 256)
  never = jnp.full((1, 1), -2, jnp.int32)  # No stop sequence: every row generates `new` tokens.
  ext = jax.jit(functools.partial(sampler_lib.extend, cfg=cfg))
  gen = jax.jit(functools.partial(sampler_lib.generate, cfg=cfg, s=s, pad_id=0))

  def cached(key):
    cache = decode.init_cache(cfg, b, prompt + new)
    logits, cache, _ = ext(params, toks, jnp.ones((b, prompt), bool), cache,
                           jnp.zeros((b, cfg.vocab_size), jnp.float32))
    out = gen(params, cache, logits, jnp.zeros((b,), bool), jnp.full((b,), new, jnp.int32),
              jax.random.key_data(jax.random.split(key, b)), never)
    return out['tokens']

  buf = jnp.zeros((b, prompt + new), jnp.int32).at[:, :prompt].set(toks)
  rec = jax.jit(functools.partial(_recompute_generate, start=prompt, new=new, cfg=cfg, temperature=1.0))
  out = {}
  for name, fn in (('kv_cache', cached), ('recompute', lambda k: rec(params, buf, k))):
    jax.block_until_ready(fn(jax.random.key(2)))  # Compile.
    t0 = time.perf_counter()
    res = jax.block_until_ready(fn(jax.random.key(3)))
    dt = time.perf_counter() - t0
    out[name] = {'seconds': dt, 'tokens_per_s': b * new / dt}
    assert np.asarray(res).shape[-1] >= new
  out['speedup'] = out['kv_cache']['tokens_per_s'] / out['recompute']['tokens_per_s']
  return out


def bench_rl_step(steps: int, init: str, workdir: str, sft_steps: int) -> dict:
  c = toolcalc_rl.get_config()
  c.rl.steps, c.eval.num_tasks, c.eval.every, c.tensorboard = steps, 0, 10 ** 6, False
  c.init_checkpoint, c.sft.steps = init, sft_steps
  runner = loop.Runner(c, workdir)
  state = runner.fresh_state(runner.warm_start(lambda i, row: None))
  keys = ('time_sample', 'time_env', 'time_critic', 'time_teacher', 'time_update')
  rows = []
  for step in range(1, steps + 1):
    state, row = runner.train_step(step, state, runner.rollouts(step, state.params))
    rows.append(row)
  timed = rows[2:] or rows
  mean = {k: float(np.mean([r[k] for r in timed])) for k in keys}
  total = sum(mean.values())
  return {'per_phase_s': mean, 'fraction': {k: v / total for k, v in mean.items()},
          'teacher_over_sampling': mean['time_teacher'] / mean['time_sample'],
          'feedback_per_step': float(np.mean([r['feedback_count'] for r in timed])),
          'rollouts_per_step': runner.batch_rows,
          'rollout_tokens_per_s': float(np.mean([r['rollout_tokens_per_s'] for r in timed]))}


def bench_sft_packing(steps: int = 200) -> dict:
  c = toolcalc_rl.get_config()
  runner = loop.Runner(c, _WORKDIR.value)
  demos, rng, seq = runner.env.demonstrations(c.sft.hint_fraction), np.random.default_rng(0), c.sampler.max_len
  packed = one_per_row = 0
  for _ in range(steps):
    convs = demos(rng, c.sft.batch_size)
    packed += sft.batch(runner.tok, convs, seq)['tokens'].size
    longest = max(len(sft.render(runner.tok, conv)[0]) for conv in convs)
    one_per_row += len(convs) * min(seq, -(-longest // 32) * 32)
  return {'packed_slots_per_step': packed / steps, 'one_per_row_slots_per_step': one_per_row / steps,
          'saved_fraction': 1 - packed / one_per_row}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  cfg = loop.model_config.from_dict(toolcalc_rl.get_config().model)
  res = {'generation': bench_generation(cfg, _BATCH.value, _NEW.value),
         'rl_step': bench_rl_step(_STEPS.value, _INIT.value, _WORKDIR.value, _SFT_STEPS.value),
         'sft_packing': bench_sft_packing()}
  g, r = res['generation'], res['rl_step']
  print(f'generation, batch {_BATCH.value}, {_NEW.value} new tokens: KV cache '
        f'{g["kv_cache"]["tokens_per_s"]:.0f} tok/s, recompute {g["recompute"]["tokens_per_s"]:.0f} tok/s, '
        f'speedup {g["speedup"]:.1f}x')
  print('RL step phases (s): ' + ', '.join(f'{k[5:]} {v:.2f} ({r["fraction"][k]:.0%})'
                                          for k, v in r['per_phase_s'].items()))
  print(f'teacher pass / sampling = {r["teacher_over_sampling"]:.2f} '
        f'({r["feedback_per_step"]:.0f} hints per step of {r["rollouts_per_step"]} rollouts)')
  p = res['sft_packing']
  print(f'warm-start token slots per step: packed {p["packed_slots_per_step"]:.0f}, one conversation per row '
        f'{p["one_per_row_slots_per_step"]:.0f} ({p["saved_fraction"]:.0%} fewer)')
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(res, f, indent=1)


if __name__ == '__main__':
  app.run(main)
