"""Episodes on Ray (research/rl/envs/ray_env.py) on a local cluster of 3 nodes (ray.cluster_utils).

A node killed mid-batch loses no episode: each ends exactly once, with the reward it gets without
the fault, none masked; a slow episode times out as a masked fault; a full worker makes calls
wait; the sampler steps Ray episodes as local ones. Skipped where Ray is not installed.
"""
from concurrent import futures
import functools
import os
import subprocess
import sys
import threading
import time

import jax
import pytest

ray = pytest.importorskip('ray', reason='Ray is not installed (requirements-ray.lock; make test installs it)')
from ray import cluster_utils  # noqa: E402

from research.model import transformer  # noqa: E402
from research.model.config import ModelConfig  # noqa: E402
from research.rl import config as rl_config  # noqa: E402
from research.rl.envs import ray_env  # noqa: E402
from research.rl.envs import registry  # noqa: E402
from research.rl.envs.base import Step  # noqa: E402
from research.rl.envs.repo import calls  # noqa: E402
from research.rl.envs.repo import env as env_repo  # noqa: E402
from research.rl.envs.repo import oracle as repo_oracle  # noqa: E402
from research.rl.envs.repo import settings as repo_settings  # noqa: E402
from research.rl.rollout.sampler import Sampler, SamplerConfig, Stream, episode_keys  # noqa: E402
from research.tasks import task as task_lib  # noqa: E402
from research.tokenizer.base import ByteTokenizer  # noqa: E402

CHATML = calls.FORMATS['chatml']


def call(name, **args) -> str:
  return CHATML.render(calls.Call(name, args))


def _started_cluster(tries: int = 3):
  """A head and two worker nodes. Ray gives a node's raylet a fixed 30 s to register; on a
  2-core machine whose other test process is grading that passed once (2026-12-06), so a start
  that times out is stopped (`ray stop`: a head that failed is in no Cluster to shut down) and
  tried again."""
  for attempt in range(tries):
    c = cluster_utils.Cluster()
    try:
      c.add_node(num_cpus=2)  # The head.
      workers = [c.add_node(num_cpus=2) for _ in range(2)]
      c.wait_for_nodes()
      return c, workers
    except Exception as e:  # pylint: disable=broad-except
      if 'timed out during startup' not in str(e) or attempt == tries - 1:
        raise
      c.shutdown()
      subprocess.run([os.path.join(os.path.dirname(sys.executable), 'ray'), 'stop', '--force'],
                     check=False, capture_output=True)


@pytest.fixture(scope='module')
def cluster():
  """A head and two worker nodes, 2 CPUs each; the tests' Ray driver is connected to it."""
  c, workers = _started_cluster()
  ray.init(address=c.address, log_to_driver=False, configure_logging=False)
  yield c, workers
  ray.shutdown()
  c.shutdown()


def _maker(task_dir):
  return functools.partial(env_repo.RepoEnv, task_dir / 'tasks.jsonl')  # Sent to the workers.


@pytest.fixture
def ray_envs(cluster):
  """Makes RayEnvs (on the cluster) and ends their workers after the test."""
  made = []
  yield lambda *args, **kw: made.append(ray_env.RayEnv(*args, **kw)) or made[-1]
  for e in made:
    e.shutdown()


def _scripts(tasks, task_dir) -> list[list[str]]:
  """Per episode its messages: the oracle's solution (reward 1), or every other one the same
  without its last edit and its test run (reward 0); each with a slow command after the first
  message, so that a node killed then is killed mid-call."""
  out = []
  for i, task in enumerate(tasks):
    solution = task_lib.read_solutions(task_dir)[task.id]
    msgs = [CHATML.render(c) for c in repo_oracle.solution_calls(task, solution, task_dir / task.tree)]
    if i % 2:
      msgs = msgs[:-3] + msgs[-1:]
    out.append(msgs[:1] + [call('run', command='sleep 2')] + msgs[1:])
  return out


def _play(episodes, scripts, at_turn=None) -> list[list]:
  """Steps every episode turn by turn, the live ones at once (as the sampler does), calling
  `at_turn(turn)` as each turn starts. Returns per episode what each call gave: Steps, or the
  exception it raised."""
  got = [[] for _ in episodes]

  def one(i, turn):
    try:
      got[i].append(episodes[i].step(scripts[i][turn]))
    except Exception as e:  # noqa: BLE001 - recorded: the test asserts there is none.
      got[i].append(e)

  with futures.ThreadPoolExecutor(len(episodes)) as pool:
    for turn in range(max(len(s) for s in scripts)):
      live = [i for i, g in enumerate(got) if not g or (isinstance(g[-1], Step) and not g[-1].done)]
      if not live:
        break
      if at_turn:
        at_turn(turn)
      list(pool.map(lambda i: one(i, turn), live))
  return got


def test_timeouts_backpressure_and_a_killed_worker(ray_envs, repo_task_dir):
  """A slow episode times out masked; a full worker makes calls wait; a killed worker process is
  replaced and its episode replayed there."""
  env = ray_envs(_maker(repo_task_dir), workers=1, worker_calls=1, warm=0, episode_timeout_s=3.0)
  task = env.local.tasks[0]
  a, b = env.reset(task), env.reset(task)
  t0 = time.perf_counter()
  with futures.ThreadPoolExecutor(2) as pool:
    steps = list(pool.map(lambda e: e.step(call('run', command='sleep 1')), [a, b]))
  assert time.perf_counter() - t0 >= 2.0  # One call slot: the second waited for the first.
  assert all(s.observation.startswith('exit code 0') for s in steps)
  with pytest.raises(ray_env.EpisodeTimeout, match='ray_episode_timeout_s'):
    a.step(call('run', command='sleep 10'))
  assert a.stats.fault and env.metrics([a])['fault_rate'] == 1.0
  first = env.handles[0]
  ray.kill(first.actor)
  assert b.close('turns').done and b.replays == 1  # The other episode goes on, on a new worker.
  assert first.lost and b.handle is not first and not b.stats.fault


def test_the_sampler_steps_ray_episodes(cluster, repo_task_dir):
  """registry.make with env.executor='ray'; the sampler drives its episodes to the turn limit."""
  c = rl_config.EnvConfig(name='repo', executor='ray', ray_workers=1,
                          repo=repo_settings.Settings(tasks=str(repo_task_dir / 'tasks.jsonl')))
  env = registry.make(c.validate(), '')
  try:
    assert isinstance(env, ray_env.RayEnv)
    tok = ByteTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=16, d_ff=64, num_experts=4, num_experts_per_tok=2, d_expert=32,
                      moe_impl='dense')
    episodes = [env.reset(env.local.tasks[0]) for _ in range(2)]
    s = SamplerConfig(max_turn_tokens=8, max_turns=2, max_len=2048, max_obs_tokens=32)
    sampler, params = Sampler(cfg, tok, s), transformer.init(cfg, jax.random.key(0))
    trajs, stats = sampler.rollout(params, episodes, jax.random.key(1))
    assert stats.faults == 0 and all(t.done and t.reward == 0.0 for t in trajs)
    assert [e.stats.ended_by for e in episodes] == ['turns', 'turns']
    assert env.metrics(episodes)['bad_calls'] == 2
    # Streamed (rl.stream): the same episodes one at a time through a refilled row, not waiting
    # for slow calls, sample what the batch sampled; a queued episode dropped is closed unscored.
    stream = Stream(sampler, 1, wait_s=0.01)
    again = stream.submit([env.reset(env.local.tasks[0]) for _ in range(3)], episode_keys(jax.random.key(1), 3),
                          groups=range(3))
    while any(not e.ended for e in again[:2]):
      stream.advance(params)
    futures.wait(stream.drop(again[2:]))
    assert [e.traj.tokens for e in again[:2]] == [t.tokens for t in trajs]
    assert again[2].episode.ended and not again[2].traj.done
  finally:
    env.shutdown()


class _Deadly:
  """An environment whose episodes end their worker's process at the message 'die' (as Ray's
  memory monitor does to a worker whose episodes fill the node)."""
  name, words = 'deadly', ()

  def reset(self, task):
    del task
    return _DeadlyEpisode()

  def at_step(self, step):
    del step


class _DeadlyEpisode:
  prompt = [{'role': 'user', 'content': 'go'}]

  def step(self, message):
    if message == 'die':
      os._exit(1)
    return Step(observation='ok')

  def close(self, reason):
    del reason
    return Step(done=True)


def test_an_episode_that_kills_its_workers_is_masked_after_its_replays(ray_envs):
  """A call that kills every worker it runs on is replayed MOST_REPLAYS times, then masked
  (WorkerLost): it does not go on killing the workers it is moved to."""
  ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # The workers cannot import tests/.
  env = ray_envs(_Deadly, workers=2, warm=0)
  ep = env.reset('task')
  assert ep.step('fine').observation == 'ok'
  with pytest.raises(ray_env.WorkerLost, match='MOST_REPLAYS'):
    ep.step('die')
  assert ep.replays == ray_env.MOST_REPLAYS and ep.ended
  assert sum(h.lost for h in env.handles) == ray_env.MOST_REPLAYS + 1  # Its worker, then one per replay.


# Last: the node it kills is gone for the module's later tests.
def test_a_node_killed_mid_batch_loses_no_episode(cluster, ray_envs, repo_task_dir):
  c, (victim, _) = cluster
  local = _maker(repo_task_dir)()
  tasks = [t for t in local.tasks if t.mode == 'body'][:3] * 2
  scripts = _scripts(tasks, repo_task_dir)
  # Without Ray, and without a fault: the rewards to match.
  local_eps = [local.reset(t) for t in tasks]
  want = _play(local_eps, scripts)
  assert [g[-1].reward for g in want] == [1.0, 0.0] * 3

  env = ray_envs(_maker(repo_task_dir), warm=1)
  assert len({h.node for h in env.handles}) == 3  # One worker per node.
  eps = [env.reset(t) for t in tasks]
  on_victim = [e for e in eps if e.handle.node == victim.node_id]
  assert on_victim

  def kill(turn):
    if turn == 1:  # Half a second into the batch's slow call.
      threading.Timer(0.5, c.remove_node, (victim,), {'allow_graceful': False}).start()
  got = _play(eps, scripts, at_turn=kill)

  for g, w, e in zip(got, want, eps):
    assert all(isinstance(s, Step) for s in g), g  # No call raised: nothing masked.
    assert [s.done for s in g] == [s.done for s in w]  # One final Step each: counted once.
    assert (g[-1].reward, g[-1].success) == (w[-1].reward, w[-1].success)
  assert {e.replays for e in on_victim} == {1}
  assert {e.replays for e in eps if e not in on_victim} == {0}
  assert all(h.lost == (h.node == victim.node_id) for h in env.handles)
  # The replayed episodes' statistics count their turns and calls once.
  mine, theirs = env.metrics(eps), local.metrics(local_eps)
  for k in ('turns', 'bad_calls', 'fault_rate', 'hack_rate', *(f'tool_calls/{n}' for n in calls.TOOLS)):
    assert mine[k] == theirs[k], k
