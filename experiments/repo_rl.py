"""Targeted-feedback RL on repository tasks (research/rl/envs/repo/env.py) with a tiny model on the CPU:
a warm start on the oracle's episodes and their hint-conditioned variants, then RL with drift.

python -m launch.rl --config=experiments/repo_rl.py --workdir=/tmp/repo_rl
python -m launch.rl --config=experiments/repo_rl.py --workdir=/tmp/repo_rl_outcome \
    --config.loss.distill_coef=0 --config.init_checkpoint=/tmp/repo_rl

Tasks: the fixture repository's, tests visible (made once under the workdir; `--config.env.tasks=`
a task file of launch.make_tasks for others); RL trains on the `train` split (a quarter is held
out, experiments/repo_rl_table.py evaluates it). Drift: RL's environment renames `view` to `open`
(the warm start's demonstrations use `view`; its hinted variants teach following a reminder that
lists renamed tools). Tokens: the repo env's code BPE (research/rl/envs/repo/code_tokenizer/, 1,536
ids, the call syntax's words one id each; the oracle's episodes take 3.5x fewer ids than bytes), so
contexts of 2048 tokens hold the oracle's longest episode twice over.
The default run is small (minutes); a tiny model trained from scratch cannot write unseen code, so
what it can learn here is the tools' syntax and the workflow (view, edit, run the tests, submit).
"""

import ml_collections

from research import configs
from research.rl import config as rl_config
from research.rl.envs import repo


def get_config() -> ml_collections.ConfigDict:
  c = configs.to_config_dict(rl_config.RLExperimentConfig())
  c.env.name = 'repo'
  c.env.tokenizer = repo.CODE_TOKENIZER  # Its vocabulary holds the call syntax's words whole.
  c.env.repo.max_turns = 6          # view, edits, run, submit.
  c.env.repo.observation_chars = 400
  c.env.repo.split = 'train'
  c.env.repo.rename = ('view', 'open')

  m = c.model
  m.vocab_size = 1536               # The code tokenizer's.
  m.d_model = 128                   # Well-formed calls: 73% at 64 (400 steps), 93-99% at 128 (600).
  m.num_layers = 2
  m.num_heads = 2
  m.num_kv_heads = 1
  m.head_dim = 32
  m.d_ff = 256
  m.num_experts = 4
  m.d_expert = 128
  m.moe_impl = 'blocked'            # The CPU path.

  s = c.sampler
  s.max_len = 2048                  # The oracle's episodes: 897 ids on average, 1,042 at most.
  s.max_turns = 6
  s.max_turn_tokens = 256           # The oracle's longest message (a feature's edit) is 233 ids.
  s.max_obs_tokens = 160            # Above env.repo.observation_chars (400 chars: 143 ids at most).
  s.bucket = 64

  c.sft.steps = 600                 # ~1.5 s each here (8 conversations packed in 2048-token rows).
  c.sft.batch_size = 8
  c.sft.hint_fraction = 0.4
  c.rl.steps = 16                   # ~14 s each here.
  c.rl.tasks_per_step = 4           # 16 episodes a step: 4 tasks, 4 rollouts each (the group baseline).
  c.rl.group_size = 4
  c.rl.max_targets = 8
  c.eval.every = 8
  c.eval.num_tasks = 4
  c.critic.rules = ('tool_call', 'protected_edit', 'syntax_error', 'run_import_error', 'run_name_error',
                    'untested_submit', 'repeated_failure', 'missing_path')
  c.checkpoint_every = 10
  c.tensorboard = False

  o = c.optimizer
  o.learning_rate = 2e-3
  o.warmup_steps = 1
  o.muon.adam_learning_rate = 2e-4
  return c
