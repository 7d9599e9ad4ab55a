"""Tables and plots of RL runs: the before/after table by rule, training curves, the ablation plot."""

import json

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
import numpy as np  # noqa: E402


def _pct(x) -> str:
  return '   -' if x is None else f'{100 * x:3.0f}%'


def summary_table(summary: dict) -> str:
  """Success rate before and after RL on the fixed eval tasks, overall and by the rule that fired."""
  lines = ['| tasks | n | success before | success after |', '|---|---|---|---|',
           f'| all | {summary["eval_tasks"]} | {_pct(summary["before"])} | {_pct(summary["after"])} |']
  for rule, r in summary['by_rule'].items():
    lines.append(f'| rule {rule} fired | {r["tasks"]} | {_pct(r["before"])} | {_pct(r["after"])} |')
  return '\n'.join(lines)


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _series(rows, key):
  pts = [(r['rollouts'], r[key]) for r in rows if key in r and 'rollouts' in r]
  return np.array(pts).T if pts else np.zeros((2, 0))


def plot_run(metrics_path: str, png: str) -> str:
  rows = read_metrics(metrics_path)
  fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
  x, y = _series(rows, 'success_rate')
  ax[0].plot(x, y, alpha=0.35, label='training rollouts')
  x, y = _series(rows, 'eval_success')
  ax[0].plot(x, y, 'o-', label='eval (fixed tasks)')
  ax[0].set(xlabel='rollouts', ylabel='success rate', ylim=(0, 1), title='success')
  ax[0].legend()
  for key in [k for k in rows[-1] if k.startswith('rule/') and k.endswith('/fires')]:
    x, y = _series(rows, key)
    ax[1].plot(x, y, label=key[5:-6])
  ax[1].set(xlabel='rollouts', ylabel='hints per step', title='feedback fired, by rule')
  ax[1].legend()
  x, y = _series(rows, 'distill_kl')
  ax[2].plot(x, y, label='teacher-student KL')
  x, y = _series(rows, 'reward_mean')
  ax[2].plot(x, y, label='reward')
  ax[2].set(xlabel='rollouts', title='distillation KL and reward')
  ax[2].legend()
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  plt.close(fig)
  return png


def plot_ablation(results: dict, png: str, target: float | None = None) -> str:
  """results[arm][seed] = {'rollouts': [...], 'success': [...]}: mean over seeds, seeds faint."""
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for i, (arm, seeds) in enumerate(results.items()):
    color = f'C{i}'
    curves = list(seeds.values())
    for s in curves:
      ax.plot(s['rollouts'], s['success'], color=color, alpha=0.25, lw=1)
    n = min(len(s['success']) for s in curves)
    ax.plot(curves[0]['rollouts'][:n], np.mean([s['success'][:n] for s in curves], 0), color=color, lw=2,
            label=arm)
  if target is not None:
    ax.axhline(target, color='gray', ls='--', lw=1, label='outcome-only final')
  ax.set(xlabel='training rollouts', ylabel='eval success rate', ylim=(0, 1),
         title='toolcalc: success vs rollouts (mean of seeds; seeds faint)')
  ax.legend()
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  plt.close(fig)
  return png
