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


def plot_arms(results: dict, png: str, panels: dict[str, str], title: str, x: str = 'rollouts',
              target: float | None = None) -> str:
  """results[arm][seed] = {x: [...], key: [...]} per panel key (panels: key -> y label): the mean
  over seeds bold, each seed faint; `target` a dashed line on the first panel."""
  fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.2), squeeze=False)
  for ax, (key, label) in zip(axes[0], panels.items()):
    for i, (arm, seeds) in enumerate(results.items()):
      curves = list(seeds.values())
      for s in curves:
        ax.plot(s[x], s[key], color=f'C{i}', alpha=0.25, lw=1)
      n = min(len(s[key]) for s in curves)
      mean = np.ma.masked_invalid(np.array([s[key][:n] for s in curves], float)).mean(0)  # NaN: no point.
      ax.plot(curves[0][x][:n], mean.filled(np.nan), color=f'C{i}', lw=2, label=arm)
    ax.set(xlabel=x, ylabel=label, ylim=(0, 1), title=f'{title}: {label} (mean of seeds; seeds faint)')
  if target is not None:
    axes[0][0].axhline(target, color='gray', ls='--', lw=1, label='outcome-only final')
  for ax in axes[0]:
    ax.legend()
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  plt.close(fig)
  return png


def plot_ablation(results: dict, png: str, target: float | None = None) -> str:
  """results[arm][seed] = {'rollouts': [...], 'success': [...]}: mean over seeds, seeds faint."""
  return plot_arms(results, png, {'success': 'eval success rate'}, 'toolcalc', target=target)
