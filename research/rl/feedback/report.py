"""Governance report of an RL run: a table and a PNG per rule@version, and a static rollout viewer.

    write(workdir, metrics_rows, log)   # workdir/governance.md, governance.png
    viewer_html(records) -> str         # one self-contained page: no scripts, no external files

A viewer record is plain data (probe.viewer_records makes them): {'title', 'prompt', 'turns':
[{'role', 'text', 'rule' (for a hint: 'rule@version'), 'tokens': [[text, divergence], ...] (for a
hinted model message)}], 'reward', 'success', 'grade'}. Divergence is the teacher-student KL per
token (nats), shown as a red heat map with the value on hover.
"""

import html
import json
import math
import os

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

HEAT_NATS = 4.0                     # KL at which the heat map is fully red.


def read_log(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _tags(rows: list[dict]) -> list[str]:
  return sorted({k.split('/')[1] for r in rows for k in r if k.startswith('gov/')})


def _fmt(x) -> str:
  return '-' if x is None or not math.isfinite(x) else f'{x:+.2f}'


def _cell(text: str) -> str:
  return text.replace('|', '\\|')  # A signature's separators would end the markdown cell.


def table(rows: list[dict], log: list[dict]) -> str:
  """Per rule@version: firings, probes, final efficacy with interval, gain, state changes; drift events."""
  lines = ['| rule@version | fired | probes (window) | efficacy [interval] | log-prob gain | decisions |',
           '|---|---|---|---|---|---|']
  for tag in _tags(rows):
    last = [r for r in rows if f'gov/{tag}/probes' in r][-1]
    g = lambda k: last[f'gov/{tag}/{k}']  # noqa: E731
    decisions = ', '.join(f'{d["decision"]} at {d["step"]}' for d in log
                          if d['kind'] == 'decision' and d['rule'] == tag) or '-'
    fired = sum(r.get(f'gov/{tag}/fires', 0) for r in rows)
    lines.append(f'| {tag} | {fired:.0f} | {g("probes"):.0f} | {_fmt(g("efficacy"))} [{_fmt(g("lo"))}, '
                 f'{_fmt(g("hi"))}] | {_fmt(g("gain"))} | {decisions} |')
  drift = [d for d in log if d['kind'] == 'drift']
  lines += ['', '| drift at step | signature | rate |', '|---|---|---|']
  lines += [f'| {d["step"]} | `{_cell(d["signature"])}` | {d["rate"]:.2f} |' for d in drift] or ['| - | - | - |']
  return '\n'.join(lines)


def plot(rows: list[dict], log: list[dict], png: str) -> str:
  """Efficacy with its interval per rule@version (suspended stretches shaded), and drift events."""
  fig, ax = plt.subplots(1, 2, figsize=(13, 4))
  for n, tag in enumerate(_tags(rows)):
    pts = [(r['step'], r[f'gov/{tag}/efficacy'], r[f'gov/{tag}/lo'], r[f'gov/{tag}/hi'], r[f'gov/{tag}/active'])
           for r in rows if f'gov/{tag}/efficacy' in r]
    steps, mean, lo, hi, active = zip(*pts)
    clip = lambda v: [max(-1.0, min(1.0, x)) if math.isfinite(x) else math.nan for x in v]  # noqa: E731
    ax[0].plot(steps, mean, color=f'C{n}', label=tag)
    ax[0].fill_between(steps, clip(lo), clip(hi), color=f'C{n}', alpha=0.15)
    off = [s for s, a in zip(steps, active) if not a]
    ax[0].scatter(off, [-1.05 - 0.04 * n] * len(off), color=f'C{n}', marker='s', s=12)
    ax[1].plot([r['step'] for r in rows if f'gov/{tag}/fires' in r],
               [r[f'gov/{tag}/fires'] for r in rows if f'gov/{tag}/fires' in r], color=f'C{n}', label=tag)
  for d in log:
    if d['kind'] == 'drift':
      ax[1].axvline(d['step'], color='k', ls=':', lw=1)
    elif d['decision'] in ('suspended', 'reinstated', 'registered'):
      ax[0].axvline(d['step'], color='gray', ls='--', lw=0.8)
  ax[0].axhline(0, color='k', lw=0.6)
  ax[0].set(xlabel='RL step', ylabel='success with hint - without', ylim=(-1.25, 1.05),
            title='efficacy per rule@version (interval shaded; squares: suspended)')
  ax[1].set(xlabel='RL step', ylabel='hints per step', title='firings (dotted: drift flagged)')
  ax[0].legend(fontsize=8)
  ax[1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  plt.close(fig)
  return png


def write(workdir: str, rows: list[dict], log: list[dict]) -> str:
  """workdir/governance.md (the table) and governance.png. Returns the table."""
  text = table(rows, log)
  with open(os.path.join(workdir, 'governance.md'), 'w') as f:
    f.write(text + '\n')
  if _tags(rows):
    plot(rows, log, os.path.join(workdir, 'governance.png'))
  return text


_CSS = """body{font-family:sans-serif;max-width:60em;margin:1em auto}
.traj{border:1px solid #ccc;margin:1em 0;padding:.5em}
.turn{margin:.2em 0;white-space:pre-wrap;font-family:monospace}
.user{color:#333}.tool{color:#555;background:#f4f4f4}
.hint{background:#fff4c2;border-left:4px solid #e0a800;padding-left:.3em}
.tok{padding:0 1px}.verdict{font-weight:bold}.ok{color:#1a7f37}.bad{color:#b00}"""


def _token(text: str, kl: float) -> str:
  a = min(max(kl, 0.0) / HEAT_NATS, 1.0)
  return (f'<span class="tok" title="KL {kl:.3f} nats" data-kl="{kl:.4f}" '
          f'style="background:rgba(220,0,0,{a:.3f})">{html.escape(text)}</span>')


def _turn(t: dict) -> str:
  if t['role'] == 'system':
    return (f'<div class="turn hint" data-rule="{html.escape(t["rule"])}">hint [{html.escape(t["rule"])}]: '
            f'{html.escape(t["text"])}</div>')
  body = ''.join(_token(s, kl) for s, kl in t['tokens']) if t.get('tokens') else html.escape(t['text'])
  return f'<div class="turn {t["role"]}">{t["role"]}: {body}</div>'


def viewer_html(records: list[dict], title: str = 'rollouts') -> str:
  """A static page of trajectories: turns, hints with rule@version, verdict, per-token divergence."""
  parts = [f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
           f'<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>'
           f'<p>Hints sit where the critic inserted them for the teacher; hinted messages show the '
           f'teacher-student KL per token (red = {HEAT_NATS:g} nats or more).</p>']
  for r in records:
    verdict = 'ok' if r['success'] else 'bad'
    parts.append(f'<div class="traj"><h3>{html.escape(r["title"])}</h3>'
                 f'<div class="turn user">user: {html.escape(r["prompt"])}</div>'
                 + ''.join(_turn(t) for t in r['turns'])
                 + f'<div class="verdict {verdict}">reward {r["reward"]:+.2f}, '
                 f'{"success" if r["success"] else "failure"}: {html.escape(r["grade"])}</div></div>')
  return ''.join(parts) + '</body></html>'
