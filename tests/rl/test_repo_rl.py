"""experiments/repo_rl.py through the RL loop: a warm start on the oracle's demonstrations, one RL
step on the fixture's tasks, and the metrics row the issue asks for."""
import json

import numpy as np

from experiments import repo_rl, repo_rl_table
from research import configs
from research.rl.feedback import critics
from research.rl.envs.repo import env as env_repo
from research.rl import loop
from research.rl.envs.repo import oracle as repo_oracle
from research.rl.sft import render
from research.rl.rollout.trajectory import Trajectory
from research.rl import config as rl_config
from research.rl.envs import registry
from research.rl.envs.repo import calls

CHATML = calls.FORMATS['chatml']
KEYS = ('step', 'reward_mean', 'success_rate', 'feedback_count', 'distill_kl', 'pg_loss', 'hack_rate',
        'env_seconds')


def _config(task_dir):
  c = repo_rl.get_config()
  c.env.repo.tasks = str(task_dir / 'tasks.jsonl')
  c.sft.steps, c.sft.batch_size = 1, 2
  c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 1, 1, 2
  c.eval.num_tasks = 1
  c.sampler.max_turn_tokens, c.sampler.max_turns = 16, 2  # The loop closes episodes after 2 turns.
  return c


def test_demonstrations_are_oracle_episodes_with_hints(repo_task_dir):
  c = configs.from_dict(rl_config.RLExperimentConfig, _config(repo_task_dir))
  env = registry.make(c.env, "")
  env = env.renamed(('view', 'open'))  # RL's drift: the warm start still uses the tools' own names.
  demos = repo_oracle.Demonstrations(env, hint_fraction=1.0)(np.random.default_rng(0), 12)
  tok = loop._tokenizer(c, env)   # The config's: the code tokenizer.
  pool = {n for names in calls.NAME_POOL.values() for n in names}
  renamed = 0
  for conv in demos:  # Each ends with a critic's hint and the one trained message it asks for.
    assert conv[-2]['role'] == 'system' and conv[-1]['role'] == 'assistant'
    assert [m for m in conv if m.get('loss')] == [conv[-1]]
    assert conv[-2]['content'].startswith(('Reminder: make exactly one tool call', 'Run the tests'))
    assert len(render(tok, conv)[0]) <= c.sampler.max_len
    name = CHATML.parse(conv[-1]['content']).name
    if name in pool:  # A renamed tool: the prompt and the reminder list the name the call uses.
      renamed += 1
      assert f'- {name}(' in conv[0]['content'] and f' {name}(' in conv[-2]['content']
  assert 0 < renamed < len(demos)
  plain_demos = repo_oracle.Demonstrations(env, hint_fraction=0.0)
  plain_demos(np.random.default_rng(0), 1)
  plain = next(iter(plain_demos.recorded.values()))  # The oracle's episode as recorded.
  assert '"submit"' in plain[-1]['content'] and all(m['loss'] for m in plain if m['role'] == 'assistant')
  assert CHATML.parse(plain[2]['content']).name == 'view' and '- view(' in plain[0]['content']


def test_recovered_demonstrations_show_failed_calls_then_the_oracle(repo_task_dir):
  c = configs.from_dict(rl_config.RLExperimentConfig, _config(repo_task_dir))
  env = registry.make(c.env, "")
  demos = repo_oracle.Demonstrations(env, hint_fraction=0.0)
  recovered = 0
  for conv in demos(np.random.default_rng(1), 16):
    task = next(t for t in env.tasks if t.file in conv[1]['content'] and t.symbol in conv[1]['content']
                and conv[1]['content'] == env_repo.task_statement(t, env.task_dir / t.tree))
    oracle = demos.recorded[task.id]
    # The trained calls are the oracle's, in order; each failed one (context) gets the env's error.
    assert [m for m in conv if m.get('loss')] == [m for m in oracle if m.get('loss')]
    failed = [i for i, m in enumerate(conv) if m['role'] == 'assistant' and not m['loss']]
    assert all(conv[i + 1]['role'] == 'tool' and conv[i + 1]['content'].startswith('error: ') for i in failed)
    assert len(failed) <= 2 and sum(m['role'] == 'assistant' for m in conv) <= env.settings.max_turns
    recovered += bool(failed)
  assert 0 < recovered < 16


def test_one_rl_step_writes_the_metrics(repo_task_dir, tmp_path):
  loop.run(_config(repo_task_dir), str(tmp_path))
  with open(tmp_path / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f]
  row = rows[-1]
  assert row['step'] == 1 and all(k in row for k in KEYS), sorted(row)
  assert row['env_seconds'] > 0 and 0 <= row['hack_rate'] <= 1
  assert (tmp_path / 'warmstart').exists()


def test_table_row_counts_calls_submits_and_drift(repo_task_dir):
  env = env_repo.RepoEnv(repo_task_dir / 'tasks.jsonl', settings=env_repo.Settings(rename=('view', 'open')))
  task = env.tasks[0]
  ep = env.reset(task)
  a = Trajectory.from_prompt([0], prompt=ep.prompt)
  for message in [CHATML.render(calls.Call('view', {'path': task.file})),   # the old name
                  CHATML.render(calls.Call('open', {'path': task.file})),   # the new one
                  CHATML.render(calls.Call('submit', {}))]:                 # untested
    a.add_model([1], [0.0], message).info = dict(ep.step(message).info)
  b = Trajectory.from_prompt([0], prompt=ep.prompt)
  other = env.reset(task)
  b.add_model([1], [0.0], 'no call').info = dict(other.step('no call').info)
  other.close('context')
  row = repo_rl_table.table_row([a, b], critics.Critic(list(repo_rl.get_config().critic.rules)), env.settings)
  assert (row['episodes'], row['success'], row['valid_call_rate']) == (2, 0.0, 0.5)
  assert row['well_formed_rate'] == 0.75  # The old name's call parses; 'no call' does not.
  assert (row['submits'], row['tested_before_submit'], row['drift_share']) == (1, 0.0, 0.5)
  assert row['adoption_episodes'] == 0.5  # `a` called `open` once; `b` never did.
  assert row['fires_per_episode']['tool_call'] == 1.0 and row['fires_per_episode']['untested_submit'] == 0.5


def test_table_means_over_seeds_and_curves_from_metrics(tmp_path):
  rows = [{'step': 0, 'eval_success': 0.0},
          {'step': 1, 'success_rate': 0.25, 'tool_calls/view': 0.0, 'stale_name_calls': 2.0,
           'hack_rate': 0.0, 'mask_rate': 0.0},
          {'step': 2, 'success_rate': 0.5, 'tool_calls/view': 1.0, 'stale_name_calls': 3.0,
           'hack_rate': 0.5, 'mask_rate': 0.25},
          {'step': 3, 'success_rate': 0.75, 'tool_calls/view': 0.0, 'stale_name_calls': 0.0,
           'hack_rate': 0.0, 'mask_rate': 0.0}]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  rl = repo_rl_table.training(str(tmp_path / 'metrics.jsonl'), ('view', 'open'))
  assert rl['step'] == [1, 2, 3] and rl['success'] == [0.25, 0.5, 0.75]
  assert rl['adoption'][:2] == [0.0, 0.25] and np.isnan(rl['adoption'][2])  # Neither name called.
  assert (rl['hack_rate'], rl['mask_rate']) == (0.5 / 3, 0.25 / 3)

  def ev(success, well_formed, tested):
    split = {'success': success, 'well_formed_rate': well_formed, 'tested_before_submit': tested,
             'drift_share': None, 'adoption_episodes': 0.0, 'hack_rate': 0.0, 'mask_rate': 0.0}
    return {'train': split, 'held_out': dict(split, success=0.0)}
  out = {'warm_start': {0: ev(0.2, 0.9, None), 1: ev(0.4, 1.0, 1.0)},
         'arms': {'feedback': {0: {**ev(0.6, 1.0, 1.0), 'rl': rl}, 1: {**ev(1.0, 1.0, 0.5), 'rl': rl}}}}
  t = repo_rl_table.table(out)
  assert t['warm start']['train success'] == {'mean': 0.30000000000000004, 'std': 0.1, 'seeds': 2}
  assert t['warm start']['tests before submit'] == {'mean': 1.0, 'std': 0.0, 'seeds': 1}  # One seed submitted.
  assert t['feedback']['adoption of the new name'] is None and t['feedback']['RL hack rate']['seeds'] == 2
  md = repo_rl_table.markdown(t).splitlines()
  assert md[2].startswith('| warm start | 0.95 +- 0.05 | 1.00 +- 0.00 | 0.30 +- 0.10 |') and len(md) == 4
  png = repo_rl_table.curves_png(out, str(tmp_path / 'curves.png'))
  assert (tmp_path / 'curves.png').read_bytes()[:4] == b'\x89PNG' and png.endswith('curves.png')
