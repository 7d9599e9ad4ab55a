"""Governed feedback (issue 15): versioned rules, efficacy and suspension, drift, the viewer; wrong_tool."""
import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

from research import configs
from research.rl.feedback import critics
from research.rl.envs import toolcalc as tc
from research.rl.feedback import governance
from research.rl.feedback import report
from research.rl.feedback import probe
from research.rl.rollout.trajectory import Trajectory
from research.rl import config as rl_config


def _traj(episode, messages, success=None):
  t = Trajectory.from_prompt([1, 2, 3], prompt=episode.prompt, task=episode.task)
  for m in messages:
    msg = t.add_model([65, 259], [0.0, 0.0], m)
    step = episode.step(m)
    msg.info = step.info
    if step.done:
      t.reward, t.success, t.done = step.reward, step.success, True
      break
    t.add_observation([4, 5], step.observation)
  return t


def _wrong(task, messages):
  ep = tc.ToolCalc().reset(task)
  return [i for i, m in enumerate(messages) if ep.step(m).info.get('wrong_op')]


def test_wrong_tool_only_on_wrong_operations():
  """The step a call attempts ignores repeats and wrong-operation calls (issue 15 item 6)."""
  task = tc.Problem((3, 4, 2), ('+', '*'))
  # A recovery after a wrong operation is right; before the fix it was judged against step 1 ('*').
  assert _wrong(task, ['sub(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)']) == [0]
  # A repeated call is repeated_call's case, and does not shift the next step.
  assert _wrong(task, ['plus(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)']) == []
  # A dodge carried on (the wrong result used for the next step) flags only the dodge.
  assert _wrong(task, ['sub(3,4)', 'mul(-1,2)', 'ans(-2)']) == [0]
  assert _wrong(task, ['mul(3,4)', 'plus(3,4)', 'mul(7,2)', 'sub(14,2)']) == [0, 3]
  t = _traj(tc.ToolCalc().reset(task), ['sub(3,4)', 'plus(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)'])
  fb = critics.Critic(['wrong_tool', 'repeated_call'])(t)
  assert [(f.message, f.rule) for f in fb] == [(0, 'wrong_tool'), (2, 'repeated_call')]


def test_rules_are_versioned_data(monkeypatch):
  monkeypatch.setattr(critics, 'REGISTRY', dict(critics.REGISTRY))
  monkeypatch.setattr(critics, 'VERSIONS', dict(critics.VERSIONS))
  t = _traj(tc.ToolCalc().reset(tc.Problem((3, 4), ('+',))), ['add(3,4)', 'plus(3,4)', 'ans(7)'])
  fb = critics.Critic(['unknown_tool'])(t)
  assert [(f.tag, f.hint) for f in fb] == [('unknown_tool@1', 'Reminder: available tools are +:plus -:sub *:mul')]
  # The same id@version with another text is refused; a revision is the next version.
  with pytest.raises(ValueError, match='unknown_tool@1 exists; a changed rule needs a higher version'):
    critics.register(critics.Template(critics.RuleSpec('unknown_tool', 1, {'error': 'unknown_tool'}, 'Tools: {tools}')))
  v2 = critics.revise('unknown_tool', hint='Tools now: {tools}')
  assert v2.version == 2 and critics.REGISTRY['unknown_tool'] is v2 and 'unknown_tool@1' in critics.VERSIONS
  fb = critics.Critic(['unknown_tool'])(t)
  assert [(f.tag, f.hint) for f in fb] == [('unknown_tool@2', 'Tools now: +:plus -:sub *:mul')]
  # A trigger item True asks for a truthy value; others for equality (all of them).
  rule = critics.Template(critics.RuleSpec.from_json(
      '{"id": "r", "version": 3, "when": {"error": "unknown_tool", "name": "add"}, "hint": "{name}!"}'))
  assert [(f.message, f.hint, f.tag) for f in rule(t)] == [(0, 'add!', 'r@3')]
  with pytest.raises(ValueError, match='needs id, version, a non-empty when and hint'):
    critics.RuleSpec.from_json('{"id": "r", "version": 1, "hint": "x"}')


def test_demonstrations_name_the_rule_version_they_teach():
  convs = tc.demonstrations(np.random.default_rng(0), 200, hint_fraction=1.0)
  hints = [m for c in convs for m in c if m['role'] == 'system']
  assert len(hints) == 200
  for m in hints:
    rule = critics.VERSIONS[m['rule']]
    assert m['rule'] == f'{rule.name}@{rule.version}' and rule.name in ('unknown_tool', 'malformed_call', 'repeated_call')
  assert {m['content'] for m in hints if m['rule'] == 'malformed_call@1'} == {'Write name(a,b) or ans(x).'}


def test_estimate_interval():
  probes = [governance.Probe('r@1', h, 0.5, 0.0) for h in (0.0, 0.25, 0.0, 0.5)]
  e = governance.estimate(probes, z=2.0)
  d = np.array([-0.5, -0.25, -0.5, 0.0])
  half = 2.0 * d.std(ddof=1) / 2
  assert (e.n, e.mean) == (4, pytest.approx(d.mean()))
  assert (e.lo, e.hi) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
  assert governance.estimate(probes[:1], 2.0).hi == math.inf


class _ScriptedProber:
  """Probe results by rule id, per call: the hint helps or hurts as the test says."""

  def __init__(self, effect):
    self.effect, self.calls = effect, []

  def __call__(self, params, teacher_params, trajs, positions, key):
    self.calls.append([fb.tag for _, fb in positions])
    return [governance.Probe(fb.tag, *self.effect(fb.rule), 1.0) for _, fb in positions]


def _batch(messages_per_traj, tools=None, task=tc.Problem((3, 4, 2), ('+', '*'))):
  env = tc.ToolCalc(tools)
  trajs = [_traj(env.reset(task), ms) for ms in messages_per_traj]
  return trajs, np.ones(len(trajs), bool)


def test_harmful_rule_suspended_retested_and_reinstated(tmp_path):
  c = governance.GovernanceConfig(enabled=True, probes_per_step=4, min_probes=3, window=6, retest_every=2)
  effect = {'repeated_call': (0.0, 0.75), 'unknown_tool': (1.0, 0.0)}
  prober = _ScriptedProber(lambda r: effect[r])
  gov = governance.Governance(c, critics.Critic(['unknown_tool', 'repeated_call']), str(tmp_path), prober)
  trajs, valid = _batch([['add(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)'],
                         ['plus(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)']])
  for step in range(1, 4):
    active, every = gov.critique(step, trajs)
    tags = {fb.tag for _, fb in active}
    row = gov.step(step, trajs, valid, every)
  # Three probes at -0.75 each: the interval lies below 0 at step 3; the helpful rule stays.
  assert gov.suspended == {'repeated_call@1'} and row['gov/repeated_call@1/active'] == 0.0
  assert row['gov/unknown_tool@1/active'] == 1.0 and row['gov/unknown_tool@1/efficacy'] == 1.0
  assert tags == {'unknown_tool@1', 'repeated_call@1'}
  active, every = gov.critique(4, trajs)
  assert {fb.tag for _, fb in active} == {'unknown_tool@1'}  # No hints, so no distillation ...
  assert {fb.tag for _, fb in every} == {'unknown_tool@1', 'repeated_call@1'}  # ... but probed.
  gov.step(4, trajs, valid, every)
  assert 'repeated_call@1' not in prober.calls[-1]  # Re-tested at a low rate: not at step 4 ...
  effect['repeated_call'] = (1.0, 0.25)  # ... and it helps again after the drift.
  for step in range(5, 12):
    gov.step(step, trajs, valid, gov.critique(step, trajs)[1])
  retests = [s for s, tags in zip(range(1, 12), prober.calls) if 'repeated_call@1' in tags]
  assert retests == [1, 2, 3, 5, 7, 9, 10, 11] and gov.suspended == set()  # Every step once reinstated.
  log = report.read_log(os.path.join(tmp_path, 'governance.jsonl'))
  assert [(d['step'], d['rule'], d['decision']) for d in log] == [(3, 'repeated_call@1', 'suspended'),
                                                                  (9, 'repeated_call@1', 'reinstated')]
  assert log[0]['evidence']['diffs'] == [-0.75] * 3 and log[0]['evidence']['hi'] < 0 < log[1]['evidence']['lo']


def test_page_hinkley_flags_a_rise_not_noise():
  rng = np.random.default_rng(0)
  ph = governance.PageHinkley(delta=0.02, lam=0.15)
  assert not any(ph.update(x) for x in rng.uniform(0.05, 0.15, 200))  # A noisy constant rate.
  flagged = [ph.update(x) for x in [0.35] * 5]
  assert flagged[0] or flagged[1]
  # Against the definition: m_t = sum(x_i - mean_i - delta), flag when m_t - min m > lambda.
  xs = [0.0, 0.1, 0.0, 0.3, 0.3]
  ref, m, m_min = [], 0.0, 0.0
  for t in range(1, len(xs) + 1):
    m += xs[t - 1] - np.mean(xs[:t]) - 0.05
    m_min = min(m_min, m)
    ref.append(m - m_min > 0.1)
  ph = governance.PageHinkley(0.05, 0.1)
  assert [ph.update(x) for x in xs] == ref


def test_drift_flags_unexplained_failures_and_a_new_rule_registers(tmp_path):
  """mul renamed to times mid-run: failures no rule explains get flagged; the rule given by config then claims them."""
  env = tc.ToolCalc(renames=('3:*:times',))
  spec = {'at': 5, 'id': 'renamed_mul', 'version': 1, 'when': {'error': 'unknown_tool', 'name': 'mul'},
          'hint': 'Reminder: available tools are {tools}'}
  c = governance.GovernanceConfig(enabled=True, new_rules=(json.dumps(spec),), drift_min_count=3)
  gov = governance.Governance(c, critics.Critic(['renamed_add']), str(tmp_path), None)
  task = tc.Problem((3, 4, 2), ('+', '*'))
  flagged = []
  for step in range(1, 7):
    env.at_step(step)
    trajs = [_traj(env.reset(task), ['plus(3,4)', 'mul(7,2)', 'ans(14)']) for _ in range(6)]
    trajs += [_traj(env.reset(task), ['plus(3,4)', 'mul(7,2)', 'ans(15)']) for _ in range(2)]  # Background.
    fb, every = gov.critique(step, trajs)
    row = gov.step(step, trajs, np.ones(len(trajs), bool), every)
    flagged += [(e['step'], e['signature']) for e in gov.events if e['step'] == step]
    assert (step >= 5) == bool(fb) and (row['unexplained_failures'] == 1.0) == (3 <= step < 5)
  assert flagged == [(3, 'unknown_tool|mul|mul(#,#)')]
  assert gov.events[0]['examples'][0][:3] == [('assistant', 'plus(3,4)'), ('tool', '7'), ('assistant', 'mul(7,2)')]
  assert [f.tag for _, f in fb][:1] == ['renamed_mul@1'] and fb[0][1].hint.endswith('*:times')
  log = report.read_log(os.path.join(tmp_path, 'governance.jsonl'))
  assert [(d['kind'], d['step']) for d in log] == [('drift', 3), ('decision', 5)]


def test_config_errors_name_the_problem():
  with pytest.raises(ValueError, match=r'governance\.new_rules=.*needs "at"'):
    configs.from_dict(governance.GovernanceConfig, {'new_rules': ('{"id": "x"}',)}, 'governance')
  with pytest.raises(ValueError, match='expected STEP:OP:NAME'):
    tc.ToolCalc(renames=('3:*:timez',))
  env = tc.ToolCalc(renames=('4:*:times', '2:+:sum'))
  assert env.at_step(1)['*'] == 'mul' and env.at_step(3) == {'+': 'sum', '-': 'sub', '*': 'mul'}
  assert env.at_step(9)['*'] == 'times' and env.reset(tc.Problem((2, 3), ('*',))).step('times(2,3)').observation == '6'


def test_replay_reaches_the_same_state():
  env = tc.ToolCalc()
  task = tc.Problem((3, 4, 2), ('+', '*'))
  t = _traj(env.reset(task), ['plus(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)'])
  ep = probe.replay(env, t, 2, 'a hint')
  assert ep.prompt[-1] == {'role': 'system', 'content': 'a hint'} and len(ep.prompt) == 1 + 4 + 1
  assert ep.prompt[1:5] == [{'role': 'assistant', 'content': 'plus(3,4)'}, {'role': 'tool', 'content': '7'}] * 2
  assert ep.step('mul(7,2)').info == t.messages[2].info
  step = ep.step('ans(14)')
  assert (t.reward, t.success) == (0.75, True) and (step.reward, step.success) == (1.0, True)  # Prefix forgiven.
  # After an invalid call the continuation can still succeed: the probe scores what follows.
  bad = _traj(env.reset(task), ['add(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)'])
  assert not bad.success
  ep = probe.replay(env, bad, 1, None)
  assert [ep.step(m).success for m in ('plus(3,4)', 'mul(7,2)', 'ans(14)')] == [False, False, True]


def _records():
  return [{'title': 'rollout 3', 'prompt': 'tools +:plus -:sub *:times\n3+4*2', 'reward': -0.25, 'success': False,
           'grade': 'answer 15 wrong (expected 14)',
           'turns': [{'role': 'system', 'text': 'Reminder: available tools are +:plus', 'rule': 'renamed_add@1'},
                     {'role': 'assistant', 'text': 'plus(3,4)', 'tokens': [['plus', 3.9], ['(3,4)', 0.01], ['', 8.0]]},
                     {'role': 'tool', 'text': '7 <b>not bold</b>'}, {'role': 'assistant', 'text': 'ans(15)'}]}]


def test_viewer_renders_in_a_headless_browser(tmp_path):
  """The static page, loaded by Debian's chromium: hints with rule@version, verdict, a red heat map."""
  browser = shutil.which('chromium') or shutil.which('chromium-browser')
  assert browser, 'chromium is missing: `make sysdeps` installs it'
  page = tmp_path / 'rollouts.html'
  page.write_text(report.viewer_html(_records(), 'test <page>'))
  flags = [browser, '--headless', '--no-sandbox', '--disable-gpu', f'--user-data-dir={tmp_path / "profile"}']
  dom = subprocess.run([*flags, '--dump-dom', page.as_uri()], capture_output=True, text=True, timeout=120).stdout
  assert '<title>test &lt;page&gt;</title>' in dom and dom.count('class="tok"') == 3
  assert 'data-rule="renamed_add@1"' in dom and 'hint [renamed_add@1]' in dom
  assert '7 &lt;b&gt;not bold&lt;/b&gt;' in dom and 'reward -0.25, failure: answer 15 wrong (expected 14)' in dom
  assert 'title="KL 3.900 nats"' in dom
  png = tmp_path / 'shot.png'
  subprocess.run([*flags, f'--screenshot={png}', '--window-size=800,600', page.as_uri()], capture_output=True,
                 timeout=120, check=True)
  import matplotlib.image
  rgb = matplotlib.image.imread(str(png))[..., :3]
  red = (rgb[..., 0] > 0.8) & (rgb[..., 1] < 0.35) & (rgb[..., 2] < 0.35)
  assert red.sum() > 50  # The full-KL tokens are painted red; nothing else on the page is.


def test_report_table_and_plot(tmp_path):
  rows = [{'step': s, 'gov/r@1/fires': 2, 'gov/r@1/probes': s, 'gov/r@1/efficacy': -0.5, 'gov/r@1/lo': -0.9,
           'gov/r@1/hi': -0.1, 'gov/r@1/gain': 2.0, 'gov/r@1/active': float(s < 3)} for s in range(1, 5)]
  log = [{'kind': 'decision', 'step': 3, 'rule': 'r@1', 'decision': 'suspended', 'evidence': {}},
         {'kind': 'drift', 'step': 4, 'signature': 'unknown_tool|mul|mul(#,#)', 'rate': 0.3, 'examples': []}]
  text = report.write(str(tmp_path), rows, log)
  assert '| r@1 | 8 | 4 | -0.50 [-0.90, -0.10] | +2.00 | suspended at 3 |' in text
  assert '| 4 | `unknown_tool\\|mul\\|mul(#,#)` | 0.30 |' in text
  assert os.path.getsize(tmp_path / 'governance.png') > 10_000


def test_governed_loop_probes_and_viewer_divergence(tmp_path):
  """Two governed RL steps of a tiny model, sampled one step ahead: real probes per rule@version; the viewer's per-token KL
  equals one computed from a hinted forward of the teacher and a plain forward of the policy."""
  import jax
  from experiments import toolcalc_rl
  from research.model import transformer
  from research.rl import loop
  from research.rl.update import losses
  from research.rl.rollout.trajectory import with_hint
  c = toolcalc_rl.get_config()
  m = c.model
  m.d_model, m.head_dim, m.num_heads, m.num_kv_heads, m.d_expert = 32, 16, 2, 1, 32
  c.sft.steps, c.sft.batch_size = 4, 8
  c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 2, 4, 2
  c.sampler.max_turns, c.sampler.max_turn_tokens, c.sampler.max_len = 3, 12, 96
  c.eval.every, c.eval.num_tasks, c.tensorboard = 2, 4, False
  c.env.toolcalc.max_ops = 1
  c.critic.rules = ('unknown_tool', 'wrong_tool', 'malformed_call')  # An untrained model is malformed.
  c.governance.enabled, c.governance.probes_per_step, c.governance.k = True, 2, 2
  c.rl.staleness = 1  # The sampler runs ahead on its thread; governance must still see each step's own hints.
  runner = loop.Runner(c, str(tmp_path))
  runner.run()
  rows = [json.loads(l) for l in open(tmp_path / 'metrics.jsonl')]
  for r in (r for r in rows if r['step'] > 0 and 'feedback_count' in r):
    fired = sum(v for k, v in r.items() if k.startswith('gov/') and k.endswith('/fires')
                and r[k.replace('fires', 'active')] == 1.0)
    assert fired == r['feedback_count'], r
  probed = [k for k in rows[-1] if k.startswith('gov/') and k.endswith('/probes') and rows[-1][k] > 0]
  assert probed and all(0 <= rows[-1][k.replace('probes', 'active')] <= 1 for k in probed)
  ro = runner.rollouts(3, runner.state.params)
  assert ro.feedback
  teacher = runner.state.teacher.params(runner.state.params)
  recs = probe.viewer_records(runner.sampler, runner.state.params, teacher, ro.trajs, ro.feedback[:1], 1)
  i, fb = ro.feedback[0]
  t, msg = ro.trajs[i], ro.trajs[i].messages[fb.message]
  ctx = with_hint(runner.tok, t, fb.message, fb.hint)
  lt = losses.tempered_log_softmax(transformer.forward(teacher, np.array([ctx.tokens]), runner.cfg)[0][0], 1.0)
  ls = losses.tempered_log_softmax(transformer.forward(runner.state.params, np.array([t.tokens]), runner.cfg)[0][0], 1.0)
  n = min(msg.end - msg.start, c.sampler.max_turn_tokens)
  pt, ps = lt[ctx.target[0] - 1:ctx.target[0] - 1 + n], ls[msg.start - 1:msg.start - 1 + n]
  ref = np.asarray((jax.numpy.exp(pt) * (pt - ps)).sum(-1))
  tokens = next(tr['tokens'] for tr in recs[0]['turns'] if 'tokens' in tr)
  np.testing.assert_allclose([d for _, d in tokens], ref, rtol=1e-3, atol=1e-4)
  assert recs[0]['turns'][fb.message * 2]['rule'] == fb.tag


def test_probe_skips_prefixes_that_leave_no_room():
  """A hinted prefix rendered from text can outgrow sampler.max_len: such a position is not probed."""
  from research.model.config import ModelConfig
  from research.rl.rollout.sampler import Sampler, SamplerConfig
  from research.tokenizer.base import ByteTokenizer
  tok = ByteTokenizer(tc.WORDS)
  # Hinted prefixes of 70, 101 and 113 tokens; a message needs 8 more.
  sampler = Sampler(ModelConfig(vocab_size=280), tok, SamplerConfig(max_len=100, max_turn_tokens=8))
  prober = probe.Prober(sampler, tc.ToolCalc(), k=2, probes_per_step=2)
  t = _traj(tc.ToolCalc().reset(tc.Problem((3, 4, 2), ('+', '*'))), ['add(3,4)', 'sub(3,4)', 'add(3,4)', 'ans(7)'])
  fb = critics.Critic(['unknown_tool', 'wrong_tool'])(t)
  fits = [prober._fits(t, f) for f in fb]
  assert [f.message for f in fb] == [0, 1, 2] and fits == [True, False, False]
  assert prober(None, None, [t], [(0, f) for f in fb[1:]], None) == []  # Nothing sampled, no error.


def test_governance_experiment_arms_and_its_harmful_rule():
  """experiments/governance.py: every arm is a valid RL config with the rules it says; the rule
  enabled as known to hurt fires on right `sub` calls and its reminder names a tool that does not
  exist, so a message that follows it fails where the original succeeded."""
  from experiments import governance as exp
  for arm, (rules, governed, new_rules) in exp.ARMS.items():
    c = configs.from_dict(rl_config.RLExperimentConfig, exp.get_config(arm, steps=3))
    assert c.critic.rules == rules and c.governance.enabled == governed and c.rl.steps == 3
    assert [governance.parse_new_rule(s)[1].id for s in c.governance.new_rules] == [r['id'] for r in new_rules]
  at, spec = governance.parse_new_rule(json.dumps(exp.HARMFUL_RULE))
  assert at < exp.RENAME_STEP and exp.HARMFUL == 'stale_sub@1'
  env = tc.ToolCalc(renames=(f'{exp.RENAME_STEP}:*:times',))
  task = tc.Problem((9, 4, 2), ('-', '+'))
  critic = critics.Critic(['renamed_add'])
  critic.rules.append(critics.Template(spec))
  t = _traj(env.reset(task), ['sub(9,4)', 'plus(5,2)', 'ans(7)'])
  assert t.success and [(fb.message, fb.rule) for fb in critic(t)] == [(0, 'stale_sub')]
  named = dict(x.split(':') for x in critic(t)[0].hint.split('are ')[1].split())
  followed = _traj(env.reset(task), [f'{named["-"]}(9,4)', 'plus(5,2)', 'ans(7)'])
  assert followed.messages[0].info['error'] == 'unknown_tool' and not followed.success


def test_probe_samples_with_the_teachers_weights():
  """Both arms of a probe are sampled by the teacher's weights (its hinted distribution is what is
  distilled), not by the policy's, which drift from a frozen teacher's."""
  import jax
  from research.model import transformer
  from research.model.config import ModelConfig
  from research.rl.rollout.sampler import Sampler, SamplerConfig
  from research.tokenizer.base import ByteTokenizer
  cfg = ModelConfig(vocab_size=280, d_model=32, num_heads=2, num_kv_heads=1, head_dim=16, num_layers=1,
                    num_experts=2, num_experts_per_tok=1, d_expert=32)
  student, teacher = (transformer.init(cfg, jax.random.key(k)) for k in (0, 1))
  sampler = Sampler(cfg, ByteTokenizer(tc.WORDS), SamplerConfig(max_len=160, max_turn_tokens=8, max_turns=2))
  seen, rollout = [], sampler.rollout
  sampler.rollout = lambda params, eps, key, **kw: (seen.append(params), rollout(params, eps, key, **kw))[1]
  t = _traj(tc.ToolCalc().reset(tc.Problem((3, 4), ('+',))), ['add(3,4)', 'ans(7)'])
  fb = critics.Critic(['unknown_tool'])(t)
  probes = probe.Prober(sampler, tc.ToolCalc(), k=2, probes_per_step=1)(student, teacher, [t], [(0, fb[0])],
                                                                         jax.random.key(2))
  assert len(probes) == 1 and probes[0].tag == 'unknown_tool@1'
  assert len(seen) == 1 and seen[0] is teacher
