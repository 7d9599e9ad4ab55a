"""The RL experiment config: every section of a `launch.rl` run, typed and validated.

    c = configs.from_dict(RLExperimentConfig, config_dict)   # loop.Runner does this

experiments/*_rl.py start from `configs.to_config_dict(RLExperimentConfig())`; docs/training.md lists
the sections. Nothing here grades or samples: a config loads without the task machinery.
"""
import dataclasses
import os

from research import configs
from research.model import config as model_config
# The environments' sections; importing them registers their critic rules (CriticConfig checks).
from research.rl.envs import toolcalc as toolcalc_lib
from research.rl.envs.repo import rules as _repo_rules  # noqa: F401
from research.rl.envs.repo import settings as repo_settings
from research.rl.feedback.critics import CriticConfig
from research.rl.feedback.governance import GovernanceConfig
from research.rl.rollout.backends import RolloutConfig
from research.rl.rollout.sampler import SamplerConfig
from research.rl.sft import SFTConfig
from research.rl.update import losses
from research.rl.update.teacher import TeacherConfig
from research.train import optimizer as optim


@dataclasses.dataclass(frozen=True)
class BaseConfig:
  """base: a converted pretrained model to start from instead of a random `model`."""
  checkpoint: str = ''              # `launch.convert --from_hf` output: start from it, not `model`.
  tokenizer: str = ''               # Its Hugging Face folder (tokenizer.json, chat template).


EXECUTORS = ('local', 'ray')


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """env: the environment tasks and rewards come from; its section configures it."""
  name: str = 'toolcalc'            # An environment: one of the sections below ('toolcalc', 'repo').
  word_tokens: bool = True          # The env's words are one token each (as in a BPE vocabulary), not bytes.
  # A tokenizer.json (or its folder, with tokenizer_config.json) instead of bytes and word_tokens,
  # e.g. the repo env's code BPE (research.rl.envs.repo.CODE_TOKENIZER); base.tokenizer wins over it.
  tokenizer: str = ''
  toolcalc: toolcalc_lib.Settings = dataclasses.field(default_factory=toolcalc_lib.Settings)  # Problems, tools, drift.
  repo: repo_settings.Settings = dataclasses.field(default_factory=repo_settings.Settings)  # Tasks, turns, limits.
  # Where episodes run: 'local' (the learner's threads) or 'ray' (Ray actors: research/rl/envs/ray_env.py).
  executor: str = 'local'
  ray_address: str = ''             # executor='ray': the cluster to join; empty: a local Ray sized to the machine.
  ray_workers: int = 0              # Worker actors holding episodes; 0: one per node with CPUs.
  ray_worker_calls: int = 64        # Calls one worker runs at once; more wait on the learner (backpressure).
  ray_warm: int = 2                 # Prepared episodes a worker keeps per task it has seen (0: none).
  ray_episode_timeout_s: float = 1800.0  # An episode's time on workers before it is masked as a fault.

  def validate(self, path: str = 'env.') -> 'EnvConfig':
    names = env_names()
    if self.name not in names:
      raise configs.invalid(path + 'name', self.name, f'expected one of {names}')
    if self.executor not in EXECUTORS:
      raise configs.invalid(path + 'executor', self.executor, f'expected one of {EXECUTORS}')
    if self.ray_address and self.executor != 'ray':
      raise configs.invalid(path + 'ray_address', self.ray_address, "is only used with executor='ray'")
    for f, low in (('ray_workers', 0), ('ray_worker_calls', 1), ('ray_warm', 0)):
      if getattr(self, f) < low:
        raise configs.invalid(path + f, getattr(self, f), f'must be >= {low}')
    if self.ray_episode_timeout_s <= 0:
      raise configs.invalid(path + 'ray_episode_timeout_s', self.ray_episode_timeout_s, 'must be positive')
    if self.tokenizer:
      file = (self.tokenizer if self.tokenizer.endswith('.json')
              else os.path.join(self.tokenizer, 'tokenizer.json'))
      if not os.path.isfile(file):
        raise configs.invalid(path + 'tokenizer', self.tokenizer, f'{file} does not exist')
    return self


def env_names() -> tuple[str, ...]:
  """The environments: EnvConfig's sections (research/rl/envs/registry.py makes each)."""
  return tuple(f.name for f in dataclasses.fields(EnvConfig) if dataclasses.is_dataclass(f.type))


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """rl: the size and length of the RL run."""
  steps: int = 40                   # RL steps (optimizer updates; the schedule's length too).
  tasks_per_step: int = 16          # Distinct tasks per step.
  group_size: int = 4               # Rollouts per task (the group baseline).
  max_targets: int = 32             # Distillation slots per step (more hints: a random subset).
  staleness: int = 0                # Steps the sampler runs ahead of the update (0: synchronous; 1: one step off).
  # Streaming (research/rl/rollout/groups.py): the sampler refills a row as soon as its episode ends
  # (continuous batching), and each update takes the first tasks_per_step groups whose episodes have
  # all ended; the others run on into later updates, so a slow episode holds up no step.
  stream: bool = False
  stream_max_staleness: int = 2     # stream: a group whose episode began more updates ago than this is dropped.
  stream_wait_s: float = 0.05       # stream: a turn waits this long for slow tool calls before sampling without them.
  # A masked episode (an environment fault: no reward) teaches nothing; many of them mean the
  # harness is broken, or that the policy found a way to break it (or, with rl.stream, to stall
  # until its group is dropped as stale: those count too). The run stops with an error once the
  # share of such episodes so far passes this, counted after mask_rate_after episodes.
  max_mask_rate: float = 0.02
  mask_rate_after: int = 50         # Episodes before the mask rate is judged (one fault in 16 is 6%).
  # The update packs rollouts into rows of sampler.max_len (first fit) and pads the row count up to
  # the nearest of this many equal steps to one row per rollout (multiples of the devices that split
  # rows), each compiled at the first update. 0: one rollout per row (the unpacked layout).
  row_buckets: int = 4

  def validate(self, path: str = 'rl.') -> 'RLConfig':
    for f in ('steps', 'tasks_per_step', 'group_size', 'max_targets'):
      if getattr(self, f) < 1:
        raise configs.invalid(path + f, getattr(self, f), 'must be positive')
    if self.staleness < 0:
      raise configs.invalid(path + 'staleness', self.staleness, 'must be >= 0')
    if self.stream and self.staleness:
      raise configs.invalid(path + 'staleness', self.staleness, 'must be 0 with rl.stream (it carries episodes over itself)')
    if self.stream_max_staleness < 0:
      raise configs.invalid(path + 'stream_max_staleness', self.stream_max_staleness, 'must be >= 0')
    if self.stream_wait_s < 0:
      raise configs.invalid(path + 'stream_wait_s', self.stream_wait_s, 'must be >= 0')
    if not 0 <= self.max_mask_rate <= 1:
      raise configs.invalid(path + 'max_mask_rate', self.max_mask_rate, 'must be in [0, 1]')
    if self.mask_rate_after < 0:
      raise configs.invalid(path + 'mask_rate_after', self.mask_rate_after, 'must be >= 0')
    if self.row_buckets < 0:
      raise configs.invalid(path + 'row_buckets', self.row_buckets, 'must be >= 0')
    return self


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """loss: the terms of the RL objective (research/rl/update/losses.py; docs/rl.md)."""
  pg_coef: float = 1.0              # Policy gradient weight; 0: distillation alone.
  distill_coef: float = 1.0         # Distillation weight; 0: outcome reward alone.
  clip_eps: float = 0.0             # > 0: PPO-clipped ratio to the sampler's log-probs.
  std_norm: bool = False            # GRPO's std normalization of advantages (Dr.GRPO: off).
  norm_tokens: int = 32             # Dr.GRPO's constant: loss = sum over tokens / (rollouts * this).
  distill_kind: str = 'forward_kl'  # 'reverse_kl', 'forward_kl', 'jsd', 'topk' or 'sampled' (docs/rl.md).
  distill_top_k: int = 8            # Tokens of the teacher kept by distill_kind='topk'.
  gate: str = 'none'                # 'none', or 'confident': distill only where the teacher is confident.
  gate_margin: float = 0.0          # gate='confident': the teacher's log-prob margin required.
  until_divergence: bool = True     # Distill a target only up to where it leaves the teacher's argmax.
  pg_on_targets: bool = False       # False: hinted messages get the distillation signal, not the PG.
  anchor_coef: float = 10.0         # KL to the teacher weights (no hint) on all other policy tokens.
  is_cap: float = 2.0               # Truncated importance sampling: token ratio to the sampler capped here (0: off).
  logit_chunk: int = 256            # Positions unembedded at a time in the update (0: the whole sequence).

  def validate(self, path: str = 'loss.') -> 'LossConfig':
    if self.distill_kind not in losses.DISTILL_KINDS:
      raise configs.invalid(path + 'distill_kind', self.distill_kind, f'expected one of {losses.DISTILL_KINDS}')
    if self.gate not in losses.GATES:
      raise configs.invalid(path + 'gate', self.gate, f'expected one of {losses.GATES}')
    if self.pg_coef == 0 and self.distill_coef == 0:
      raise ValueError(f'{path}pg_coef and {path}distill_coef are both 0: nothing to train')
    if self.norm_tokens < 1:
      raise configs.invalid(path + 'norm_tokens', self.norm_tokens, 'must be positive')
    for f in ('is_cap', 'logit_chunk'):
      if getattr(self, f) < 0:
        raise configs.invalid(path + f, getattr(self, f), 'must be >= 0')
    if 0 < self.is_cap < 1:
      raise configs.invalid(path + 'is_cap', self.is_cap, 'must be 0 (off) or >= 1')
    return self


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """eval: the fixed held-out tasks evaluated before, during and after RL."""
  every: int = 10                   # RL steps between evaluations.
  num_tasks: int = 64               # Held-out tasks, one sampled rollout each.

  def validate(self, path: str = 'eval.') -> 'EvalConfig':
    for f, low in (('every', 1), ('num_tasks', 0)):
      if getattr(self, f) < low:
        raise configs.invalid(path + f, getattr(self, f), f'must be >= {low}')
    return self


@dataclasses.dataclass(frozen=True)
class RLExperimentConfig:
  """An RL run (launch/rl.py): every section, each with its defaults."""
  seed: int = 0                     # Init, warm-start data, RL tasks, sampling and eval tasks.
  init_checkpoint: str = ''         # A workdir holding warmstart/; empty: run the warm start here.
  checkpoint_every: int = 50        # RL steps between checkpoints (the run resumes from the last).
  tensorboard: bool = True          # Also write TensorBoard events next to metrics.jsonl.
  mesh: str = 'data:1'              # Axis sizes (data, fsdp, expert, tensor) of the update, sampler and teacher.
  base: BaseConfig = dataclasses.field(default_factory=BaseConfig)
  model: model_config.ModelConfig = dataclasses.field(default_factory=model_config.ModelConfig)
  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
  sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)  # Which engine samples.
  rl: RLConfig = dataclasses.field(default_factory=RLConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
  critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
  governance: GovernanceConfig = dataclasses.field(default_factory=GovernanceConfig)
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
  optimizer: optim.OptimizerConfig = dataclasses.field(default_factory=optim.OptimizerConfig)  # The RL update.
