"""Rollouts from ours and from vLLM side by side: tokens/s, log-prob agreement, weight pushes.

python -m experiments.benchmarks.rollout_engines --json=/tmp/rollout_engines.json [--models=repo_rl,qwen3_moe_62m]

Per model (experiments/repo_rl.py's, a Qwen3-MoE of 62M parameters; qwen3_moe_250m on request),
float32, random weights (`--init_std`, wide enough that log-probs spread), the repo env's code
tokenizer, the same `--batch` one-turn episodes (the same prompts) and the same budget of
`--new_tokens` per message:
  tokens_per_s      - ours and vLLM's, new tokens over the rollout's time outside the environment,
                      the second rollout of each (ours compiles in its first, vLLM starts in its);
  max_abs_logprob_diff - the engine's log-probs of the tokens of vLLM's rollout (each after the ones
                      before it) against our forward on the same tokens; sampled_logprob_diff: the
                      log-probs the engine recorded while sampling against our tempered forward;
  push              - new params pushed in place: seconds writing the folder (research/hf) and
                      loading it into the running engine, and afterwards the engine's log-probs
                      against the new params' forward and against the old params'.
With --fleet=N the same numbers again (`fleet`) from N engine servers on loopback
(rollout.vllm_engines: each sent the weights over its connection, rows split among them).
Needs the vLLM venv (`make vllm-venv`).
"""

import dataclasses
import json
import os
import tempfile

from absl import app, flags
import jax
import numpy as np

from experiments import repo_rl
from research import configs
from research.model import stats
from research.model import transformer
from research.model.config import ModelConfig
from research.rl.envs import repo
from research.rl.envs.base import Step
from research.rl.rollout import backends
from research.rl.rollout import vllm_client
from research.rl.rollout.sampler import SamplerConfig
from research.rl.rollout.trajectory import Trajectory, to_batch
from research.tokenizer.hf import HFTokenizer

_JSON = flags.DEFINE_string('json', None, 'Also write the numbers here.')
_MODELS = flags.DEFINE_list('models', ['repo_rl', 'qwen3_moe_62m'], 'Models to run (MODELS).')
_BATCH = flags.DEFINE_integer('batch', 8, 'Episodes per rollout.')
_NEW = flags.DEFINE_integer('new_tokens', 128, 'Token budget of the message.')
_INIT_STD = flags.DEFINE_float('init_std', 0.1, 'Weights scale (0.02 leaves every distribution near uniform).')
_TEMPERATURE = flags.DEFINE_float('temperature', 1.0, 'Sampling temperature.')
_FLEET = flags.DEFINE_integer('fleet', 0, 'Also measure this many engine servers on loopback (0: none).')


def _repo_rl_model() -> ModelConfig:
  return configs.from_dict(ModelConfig, repo_rl.get_config().model)


MODELS = {
    'repo_rl': _repo_rl_model,
    'qwen3_moe_62m': lambda: ModelConfig(
        vocab_size=1536, d_model=512, num_layers=6, num_heads=8, num_kv_heads=2, head_dim=64, d_ff=1536,
        num_experts=8, num_experts_per_tok=2, d_expert=768, moe_impl='blocked'),
    'qwen3_moe_250m': lambda: ModelConfig(  # Push seconds against size (not run by default).
        vocab_size=1536, d_model=1024, num_layers=8, num_heads=16, num_kv_heads=4, head_dim=64, d_ff=3072,
        num_experts=8, num_experts_per_tok=2, d_expert=1152, moe_impl='blocked'),
}


class OneTurn:
  """An episode that ends after the model's first message."""

  def __init__(self, text: str):
    self.prompt = [{'role': 'user', 'content': text}]

  def step(self, message):
    return Step(None, True, 0.0, False, {})

  def close(self, reason):
    return Step(None, True, 0.0, False, {})


def _episodes(n: int) -> list[OneTurn]:
  words = ['view', 'edit', 'run', 'tests', 'submit', 'def', 'return', 'import', 'class', 'file']
  rng = np.random.default_rng(0)
  return [OneTurn(' '.join(rng.choice(words, 12 + i))) for i in range(n)]


def our_logprobs(params, cfg: ModelConfig, trajs: list[Trajectory], pad_id: int, temperature: float = 1.0):
  """Our forward's log-prob of each token after the ones before it, B x T (0 past a row's end), and
  the trajectories' batch (to_batch)."""
  b = to_batch(trajs, max(len(t.tokens) for t in trajs), pad_id)
  logits = transformer.forward(params, b['tokens'], cfg, segment_ids_BxT=b['segment_ids'])[0]
  lp = np.asarray(jax.nn.log_softmax(logits.astype(np.float32) / temperature))
  return np.take_along_axis(lp, b['targets'][..., None], -1)[..., 0], b


def _diff(engine_rows: list[np.ndarray], ours_BxT: np.ndarray) -> float:
  """Max |engine - ours| over every predicted token (the engine's rows start with the first token's 0)."""
  return float(max(np.abs(e[1:] - ours_BxT[i, :len(e) - 1]).max() for i, e in enumerate(engine_rows)))


def _tokens_per_s(backend, params, episodes_fn, key) -> float:
  backend.rollout(params, episodes_fn(), key)  # Ours compiles, vLLM starts.
  _, st = backend.rollout(params, episodes_fn(), jax.random.fold_in(key, 1))
  return st.new_tokens / st.sample_s


def bench(name: str, weights_dir: str) -> dict:
  cfg = dataclasses.replace(MODELS[name](), init_std=_INIT_STD.value, param_dtype='float32', dtype='float32')
  tok = HFTokenizer(repo.CODE_TOKENIZER)
  s = SamplerConfig(temperature=_TEMPERATURE.value, max_turn_tokens=_NEW.value, max_turns=1,
                    max_len=_NEW.value + 128, bucket=64)
  old, new = transformer.init(cfg, jax.random.key(0)), transformer.init(cfg, jax.random.key(1))
  episodes = lambda: _episodes(_BATCH.value)  # noqa: E731 - fresh episodes, the same prompts.
  ours = backends.make(backends.RolloutConfig(), cfg, tok, s)
  out = {'model': name, 'params': stats.param_counts(cfg), 'batch': _BATCH.value, 'new_tokens': _NEW.value,
         'ours_tokens_per_s': _tokens_per_s(ours, old, episodes, jax.random.key(0))}
  rc = backends.RolloutConfig(backend='vllm', weights_dir=weights_dir)
  out.update(_engine(backends.make(rc, cfg, tok, s), cfg, tok, s, old, new, episodes))
  if _FLEET.value:
    # Each server on its own share of the cores, as on its own host (two engines' OpenMP threads
    # spinning on the same cores slow both many times over).
    per = max(os.cpu_count() // _FLEET.value, 1)
    servers = [vllm_client.start_server(
        rc.python_path, '127.0.0.1:0',
        {'VLLM_CPU_KVCACHE_SPACE': '2', 'VLLM_CPU_OMP_THREADS_BIND': f'{i * per % os.cpu_count()}-{(i * per % os.cpu_count()) + per - 1}'},
        os.path.join(weights_dir, f'server{i}.log')) for i in range(_FLEET.value)]
    try:
      fleet = dataclasses.replace(rc, vllm_engines=tuple(a for _, a in servers))
      out['fleet'] = {'engines': _FLEET.value,
                      **_engine(backends.make(fleet, cfg, tok, s), cfg, tok, s, old, new, episodes)}
    finally:
      for proc, _ in servers:
        proc.kill()
  return out


def _engine(vllm, cfg, tok, s, old, new, episodes) -> dict:
  """A vLLM backend's numbers (module docstring); closes it."""
  out = {}
  try:
    out['vllm_tokens_per_s'] = _tokens_per_s(vllm, old, episodes, jax.random.key(0))
    out['engine_start_s'] = vllm.pushes[0].write_s + vllm.pushes[0].load_s
    trajs, _ = vllm.rollout(old, episodes(), jax.random.key(2))
    rows = [t.tokens for t in trajs]
    want, b = our_logprobs(old, cfg, trajs, tok.pad_id)
    out['max_abs_logprob_diff'] = _diff(vllm.logprobs(old, rows), want)
    tempered, _ = our_logprobs(old, cfg, trajs, tok.pad_id, s.temperature)
    out['sampled_logprob_diff'] = float(np.abs((b['sampler_logp'] - tempered) * b['mask']).max())
    out['sampled_tokens'] = int(b['mask'].sum())
    got = vllm.logprobs(new, rows)  # Pushes `new` in place first.
    push = vllm.pushes[-1]
    out['push'] = {'write_s': push.write_s, 'load_s': push.load_s, 'total_s': push.write_s + push.load_s,
                   'bytes': int(sum(x.nbytes for x in jax.tree.leaves(new))), 'restarted': push.started,
                   'diff_to_new': _diff(got, our_logprobs(new, cfg, trajs, tok.pad_id)[0]),
                   'diff_to_old': _diff(got, want)}
  finally:
    vllm.close()
  return out


def main(argv):
  del argv
  results = []
  with tempfile.TemporaryDirectory(dir='/dev/shm' if os.path.isdir('/dev/shm') else None) as d:
    for name in _MODELS.value:
      results.append(bench(name, d))
      print(json.dumps(results[-1], indent=1), flush=True)
  print(f'| model | params | ours tok/s | vLLM tok/s | max_abs_logprob_diff | push s | after push: diff to new / old |')
  print('|---|---:|---:|---:|---:|---:|---|')
  for r in results:
    rows = [(r['model'], r)] + ([(f"{r['model']}, fleet of {r['fleet']['engines']}", r['fleet'])] if 'fleet' in r else [])
    for name, e in rows:
      p = e['push']
      print(f"| {name} | {r['params']['total_params'] / 1e6:.1f}M | {r['ours_tokens_per_s']:.0f} | "
            f"{e['vllm_tokens_per_s']:.0f} | {e['max_abs_logprob_diff']:.1e} | {p['total_s']:.2f} | "
            f"{p['diff_to_new']:.1e} / {p['diff_to_old']:.2f} |")
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  app.run(main)
