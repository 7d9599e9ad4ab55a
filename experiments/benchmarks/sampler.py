"""Repository RL's sampler against a minimal decode loop, its compiles, and tokens per episode.

python -m experiments.benchmarks.sampler --json=/tmp/sampler.json [--steps=5] [--workdir=/tmp/sampler_bench]

On experiments/repo_rl.py (one device, as `launch.rl` runs it), two processes one after the other
run the same short run (warm start of --sft_steps, then --steps RL steps on the fixture's tasks),
sharing a persistent compilation cache that starts empty:
  cold  - compile seconds with the empty cache (tracing, lowering and XLA's compile of every
          program), compiles during each RL step (any program first needed after step 1 counts),
          each step's parts, the sampler's tokens/s (sampled tokens over the rollout's wall time
          outside the environment: prefills, decoding and host work, steps 2.. so no compile);
          then, in the same process on the same params, `reference_tokens_per_s`: a minimal jitted
          decode loop (prefill the rollouts' prompt, then sample token after token on the KV
          cache in one fori_loop, no stop test, no turns) with the rollouts' batch and their mean
          sampled tokens per row; `ratio` = sampler / reference.
  warm  - compile seconds of the second process (every program from the cache).
tokens_per_episode: the oracle's episodes of the fixture's tasks rendered with the byte tokenizer
(plus the call syntax's words, the earlier config's) and with the code tokenizer.
"""

import json
import os
import shutil
import subprocess
import sys
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import repo_rl
from launch import processes
from research.model import decode
from research.rl import loop
from research.rl.envs import repo
from research.rl.envs.repo import env as env_repo
from research.rl.envs.repo import oracle
from research.rl.envs.repo.settings import Settings
from research.tokenizer.base import ByteTokenizer
from research.tokenizer.hf import HFTokenizer

_JSON = flags.DEFINE_string('json', None, 'Also write the numbers here.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/sampler_bench', 'Scratch directory (emptied first).')
_STEPS = flags.DEFINE_integer('steps', 5, 'RL steps per run.')
_SFT_STEPS = flags.DEFINE_integer('sft_steps', 2, 'Warm-start steps (their compiles count too).')
_PART = flags.DEFINE_enum('part', 'all', ['all', 'run'], 'run: one process of the pair (internal).')
_OUT = flags.DEFINE_string('out', '', 'part=run: where to write its numbers.')
_TASKS = flags.DEFINE_string('tasks', '', 'part=run: the task file of the fixture (made once by part=all).')

_COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration', '/jax/core/compile/jaxpr_to_mlir_module_duration',
                   '/jax/core/compile/backend_compile_duration')
PARTS = ('time_sample', 'time_env', 'time_critic', 'time_teacher', 'time_update', 'time_step')


class CompileLog:
  """Seconds of JAX's compile events, and XLA compiles, by the phase of the run they fall in."""

  def __init__(self):
    self.phase, self.seconds, self.compiles = 'setup', {}, {}
    jax.monitoring.register_event_duration_secs_listener(self._event)

  def _event(self, name: str, seconds: float, **kw) -> None:
    del kw
    if name in _COMPILE_EVENTS:
      self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + seconds
    if name == _COMPILE_EVENTS[-1]:
      self.compiles[self.phase] = self.compiles.get(self.phase, 0) + 1


def reference_decode(params, cfg, prompt_ids: list[int], batch: int, new: int, temperature: float) -> float:
  """Tokens/s of the minimal loop: prefill `prompt_ids` in every row, then `new` sampled tokens
  (the median of five runs)."""
  p = len(prompt_ids)
  tokens = jnp.tile(jnp.asarray(prompt_ids, jnp.int32)[None], (batch, 1))

  @jax.jit
  def run(params, key):
    cache = decode.init_cache(cfg, batch, p + new)
    logits, cache = decode.prefill(params, tokens, jnp.ones((batch, p), bool), cache, cfg)

    def body(i, c):
      logits, cache, key, out = c
      key, sub = jax.random.split(key)
      tok = jax.random.categorical(sub, logits / temperature).astype(jnp.int32)
      logits, cache = decode.decode_step(params, tok, cache, cfg)
      return logits, cache, key, out.at[:, i].set(tok)

    return jax.lax.fori_loop(0, new, body, (logits, cache, key, jnp.zeros((batch, new), jnp.int32)))[3]

  jax.block_until_ready(run(params, jax.random.key(0)))  # Compile.
  seconds = []
  for i in range(1, 6):  # One run is a fraction of a second: its time alone swung by 50%.
    t0 = time.perf_counter()
    jax.block_until_ready(run(params, jax.random.key(i)))
    seconds.append(time.perf_counter() - t0)
  return batch * new / float(np.median(seconds))


def run_part(workdir: str, tasks: str, steps: int, sft_steps: int) -> dict:
  """One process: warm start, RL steps, compile accounting; the reference loop after them."""
  log = CompileLog()
  c = repo_rl.get_config()
  c.env.repo.tasks = tasks
  c.sft.steps, c.rl.steps, c.eval.num_tasks, c.tensorboard = sft_steps, steps, 0, False
  runner = loop.Runner(c, workdir)
  state = runner.fresh_state(runner.warm_start(lambda i, row: None))
  rows = []
  for step in range(1, steps + 1):
    log.phase = f'step{step}'
    ro = runner.rollouts(step, state.params)
    state, row = runner.train_step(step, state, ro)
    rows.append(row)
  log.phase = 'reference'
  trajs = ro.trajs
  new = int(np.mean([t.num_policy_tokens for t in trajs]))
  prompt = trajs[0].tokens[:trajs[0].messages[0].start]
  ref = reference_decode(state.params, runner.cfg, prompt, len(trajs), new, c.sampler.temperature)
  timed = rows[1:] or rows
  sampler_tps = float(np.mean([r['rollout_tokens_per_s'] for r in timed]))
  return {
      'compile_seconds': sum(v for k, v in log.seconds.items() if k != 'reference'),
      'compile_seconds_by_phase': log.seconds, 'compiles_by_phase': log.compiles,
      'compiles_after_first_step': sum(log.compiles.get(f'step{s}', 0) for s in range(2, steps + 1)),
      'sampler_tokens_per_s': sampler_tps, 'reference_tokens_per_s': ref, 'ratio': sampler_tps / ref,
      'reference_batch': len(trajs), 'reference_new_tokens': new, 'reference_prompt_tokens': len(prompt),
      'cache_len': runner.scfg.cache_len,
      'step_parts_s': {k: float(np.mean([r[k] for r in timed])) for k in PARTS if k in timed[0]},
      'env_seconds': float(np.mean([r['env_seconds'] for r in timed])),
      'grade_seconds': float(np.mean([r['grade_seconds'] for r in timed])),
      'episodes_per_step': runner.batch_rows,
      'policy_tokens_per_episode': float(np.mean([r['policy_tokens'] for r in timed])),
  }


def tokens_per_episode(tasks: str) -> dict:
  """The oracle's fixture episodes (observations capped as the config caps them) by both tokenizers."""
  c = repo_rl.get_config()
  env = env_repo.make(Settings(tasks=tasks, observation_chars=c.env.repo.observation_chars), '')
  convs = oracle.episodes(env)
  byte = oracle.tokens_per_episode(ByteTokenizer(env_repo.WORDS), convs)
  code = oracle.tokens_per_episode(HFTokenizer(repo.CODE_TOKENIZER), convs)
  return {'bytes': byte, 'code': code, 'ratio': byte / code, 'episodes': len(convs)}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  wd = _WORKDIR.value
  if _PART.value == 'run':
    processes.enable_compilation_cache(os.path.join(wd, 'compile_cache'))
    res = run_part(os.path.splitext(_OUT.value)[0], _TASKS.value, _STEPS.value,
                   _SFT_STEPS.value)
    with open(_OUT.value, 'w') as f:
      json.dump(res, f, indent=1)
    return
  shutil.rmtree(wd, ignore_errors=True)
  os.makedirs(wd)
  tasks = env_repo.make(Settings(), wd).task_file  # The fixture's tasks, made once for every part.
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}  # One device, as launch.rl runs it.
  runs = {}
  for name in ('cold', 'warm'):
    out = os.path.join(wd, f'{name}.json')
    subprocess.run([sys.executable, '-m', 'experiments.benchmarks.sampler', '--part=run', f'--workdir={wd}',
                    f'--out={out}', f'--tasks={tasks}', f'--steps={_STEPS.value}', f'--sft_steps={_SFT_STEPS.value}'],
                   check=True, env=env)
    with open(out) as f:
      runs[name] = json.load(f)
  cold = runs['cold']
  res = {k: cold[k] for k in ('sampler_tokens_per_s', 'reference_tokens_per_s', 'ratio', 'compiles_after_first_step')}
  res.update(compile_seconds_cold=cold['compile_seconds'], compile_seconds_warm=runs['warm']['compile_seconds'],
             tokens_per_episode=tokens_per_episode(str(tasks)), runs=runs,
             machine=f'{os.cpu_count()} CPUs, jax {jax.__version__}', date=time.strftime('%Y-%m-%d'))
  t = res['tokens_per_episode']
  print(f'sampler {res["sampler_tokens_per_s"]:.0f} tok/s, reference {res["reference_tokens_per_s"]:.0f} tok/s, '
        f'ratio {res["ratio"]:.2f}; compiles after step 1: {res["compiles_after_first_step"]}; compile s '
        f'cold {res["compile_seconds_cold"]:.1f}, warm {res["compile_seconds_warm"]:.1f}; tokens per episode '
        f'bytes {t["bytes"]:.0f}, code {t["code"]:.0f} ({t["ratio"]:.2f}x)')
  print('RL step parts (s): ' + ', '.join(f'{k[5:]} {v:.2f}' for k, v in cold['step_parts_s'].items()))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(res, f, indent=1)


if __name__ == '__main__':
  app.run(main)
