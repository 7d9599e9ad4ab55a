"""The pure training step and the sharded state it runs on.

`train_step(state, batch, rng) -> (state, metrics)` is jitted with explicit in/out shardings and
donates the state. The router's selection bias takes no gradient: it is updated after the optimizer
from the load the forward pass measured (aux-loss-free balancing).
"""

import dataclasses
import functools
from collections.abc import Callable

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from research.model import moe as moe_lib
from research.model import transformer
from research.model.config import ModelConfig
from research.parallel import sharding
from research.optim.qk_clip import qk_clip
from research.train import optimizer as optim


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState


def trainable_labels(params) -> dict:
  return jax.tree_util.tree_map_with_path(
      lambda path, _: 'train' if transformer.is_trainable(path) else 'frozen', params)


def freeze_untrainable(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """Routes leaves that are updated outside the optimizer (router bias) to a zero update."""
  return optax.multi_transform({'train': tx, 'frozen': optax.set_to_zero()}, trainable_labels)


# The forward's own outputs in a loss's aux; every other aux entry is one of the loss's metrics.
MODEL_AUX = ('load', 'aux_loss', 'z_loss', 'attn_max_logit', 'routes')


@functools.partial(jax.named_call, name='loss')
def token_nll(logits_BxTxV, targets_BxT):
  """-log softmax(logits)[target] per position: logsumexp less the target's logit, picked by a
  one-hot product. Its gradient is elementwise, where take_along_axis's is a scatter into a zeroed
  B x T x V buffer, and no log-softmax is kept."""
  onehot_BxTxV = jax.nn.one_hot(targets_BxT, logits_BxTxV.shape[-1], dtype=logits_BxTxV.dtype)
  return jax.nn.logsumexp(logits_BxTxV, axis=-1) - jnp.sum(logits_BxTxV * onehot_BxTxV, axis=-1)


def loss_fn(params, batch, cfg: ModelConfig):
  """Mean next-token cross-entropy over loss_mask. Returns (loss, aux: the forward's and 'ce', 'tokens')."""
  logits_BxTxV, aux, _ = transformer.forward(params, batch['tokens'], cfg,
                                             segment_ids_BxT=batch['segment_ids'])
  nll_BxT = token_nll(logits_BxTxV, batch['targets'])
  mask = batch['loss_mask'].astype(jnp.float32)
  ce = jnp.sum(nll_BxT * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  return ce, {'ce': ce, 'tokens': jnp.sum(batch['loss_mask']), **aux}


def router_loss(aux: dict, cfg: ModelConfig):
  """The MoE router's load-balancing and z losses (0 without MoE layers)."""
  if 'load' not in aux:
    return jnp.zeros(())
  return cfg.aux_loss_coef * jnp.sum(aux['aux_loss']) + cfg.z_loss_coef * jnp.sum(aux['z_loss'])


def apply_qk_clip(params: dict, max_logit_LxH, cfg: ModelConfig, tau: float) -> dict:
  """MuonClip: rescales the query/key weights of heads whose max logit exceeded tau."""
  targets = optim.qk_clip_targets(cfg)
  params, start = dict(params), 0
  for name in ('dense_layers', 'moe_layers'):
    if name in params:
      n = params[name]['attn_norm'].shape[0]
      attn = params[name]['attn']
      clipped = qk_clip(attn, max_logit_LxH[start:start + n], {k: targets.get(k) for k in attn}, tau)
      params[name] = {**params[name], 'attn': clipped}
      start += n
  return params


# Aux entries a microbatched step does not average: the token count (summed) and the max logits (max).
_UNWEIGHTED = ('tokens', 'attn_max_logit')


def microbatch_split(batch: dict, microbatches: int) -> dict:
  """Every leaf (B x ...) as microbatches x B/microbatches x ...: microbatch j holds rows j, j + m,
  j + 2m, ... so that each device's share of every microbatch is rows it already holds."""
  def split(path, x):
    if x.ndim == 0 or x.shape[0] % microbatches:
      raise ValueError(f'batch{jax.tree_util.keystr(path)} of shape {x.shape}: its rows do not split '
                       f'into microbatches={microbatches}')
    return jnp.moveaxis(x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]), 1, 0)
  return jax.tree_util.tree_map_with_path(split, batch)


def accumulated_value_and_grad(total: Callable, params, batch: dict, microbatches: int):
  """jax.value_and_grad(total, has_aux=True)(params, batch), the batch run as `microbatches`
  sequential microbatches (activation memory / microbatches) whose values, gradients (summed in
  float32) and aux entries are averaged weighted by their aux['tokens'] (summed itself), so a
  token-mean loss gets the whole batch's value and gradient; aux 'attn_max_logit' is the max over
  microbatches and the per-token 'routes' are dropped. Router statistics (load, aux and z losses)
  are so averaged over microbatches, each measured on its own (as with balancing per microbatch)."""
  grad_fn = jax.value_and_grad(total, has_aux=True)
  if microbatches == 1:
    return grad_fn(params, batch)

  def weighted(mb):
    (value, aux), grads = grad_fn(params, mb)
    if 'tokens' not in aux:
      raise ValueError(f'microbatches={microbatches} weighs microbatches by the loss\'s aux["tokens"], '
                       f'which this loss does not give (aux: {sorted(aux)})')
    w = aux['tokens'].astype(jnp.float32)
    aux = {k: v if k in _UNWEIGHTED else w * v for k, v in aux.items() if k != 'routes'}
    return w * value, aux, jax.tree.map(lambda g: w * g.astype(jnp.float32), grads), w

  def body(acc, mb):
    new = weighted(mb)
    add = lambda k, a, b: jnp.maximum(a, b) if k == 'attn_max_logit' else a + b
    return (acc[0] + new[0], {k: add(k, a, new[1][k]) for k, a in acc[1].items()},
            jax.tree.map(jnp.add, acc[2], new[2]), acc[3] + new[3]), None
  micro = microbatch_split(batch, microbatches)
  shapes = jax.eval_shape(weighted, jax.tree.map(lambda x: x[0], micro))
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  if 'attn_max_logit' in zero[1]:
    zero[1]['attn_max_logit'] = jnp.full_like(zero[1]['attn_max_logit'], -jnp.inf)
  (value, aux, grads, w), _ = jax.lax.scan(body, zero, micro)
  w = jnp.maximum(w, 1.0)
  aux = {k: v if k in _UNWEIGHTED else v / w for k, v in aux.items()}
  return (value / w, aux), jax.tree.map(lambda g, p: (g / w).astype(p.dtype), grads, params)


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, cfg: ModelConfig,
               tx: optax.GradientTransformation, qk_clip_tau: float = 0.0, loss: Callable = loss_fn,
               microbatches: int = 1):
  """One optimizer step on `loss(params, batch, cfg) -> (objective, aux)` (supervised CE, the RL
  objective), aux holding the forward's outputs: the router losses are added here, the router bias
  is updated after the optimizer, MuonClip applied. With microbatches > 1 the gradient is
  accumulated over that many sequential microbatches (`accumulated_value_and_grad`) before the one
  update. rng is reserved for stochastic layers (none yet).
  Returns (state, metrics): loss, grad_norm, router statistics and the loss's own aux entries."""
  del rng

  def total(params, batch):
    objective, aux = loss(params, batch, cfg)
    return objective + router_loss(aux, cfg), aux

  (value, aux), grads = accumulated_value_and_grad(total, state.params, batch, microbatches)
  with jax.named_scope('optimizer'):
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
  if qk_clip_tau:
    params = apply_qk_clip(params, aux['attn_max_logit'], cfg, qk_clip_tau)
  metrics = {'loss': value, 'grad_norm': optax.tree.norm(grads),
             **{k: v for k, v in aux.items() if k not in MODEL_AUX}}
  if 'load' in aux:
    load_LxE = aux['load']
    if cfg.router == 'sigmoid' and cfg.bias_update_rate:
      moe_p = params['moe_layers']['moe']
      params['moe_layers']['moe'] = {**moe_p, 'router_bias': jax.vmap(
          moe_lib.update_router_bias, (0, 0, None))(moe_p['router_bias'], load_LxE, cfg.bias_update_rate)}
    metrics.update(router_max_load=jnp.max(load_LxE) * cfg.num_experts,
                   aux_loss=jnp.sum(aux['aux_loss']), z_loss=jnp.sum(aux['z_loss']))
  if qk_clip_tau:  # Otherwise left out: a flash kernel does not give it, and XLA drops its extra pass.
    metrics['attn_max_logit'] = jnp.max(aux['attn_max_logit'])
  return TrainState(state.step + 1, params, opt_state), metrics


@dataclasses.dataclass(frozen=True, eq=False)
class MeshJit:
  """A jitted function whose calls, and lowerings (for its compiled program: `lower(...).compile()`,
  the executable the calls use), run inside `mesh`."""
  jitted: Callable
  mesh: Mesh

  def __call__(self, *args, **kwargs):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with jax.set_mesh(self.mesh):
      return self.jitted.lower(*args, **kwargs)


@dataclasses.dataclass(eq=False)  # Hashable by identity: samplers cache their programs per trainer.
class Trainer:
  """Sharded init and the jitted step for one model config, optimizer and mesh.

  `rules` lays out everything: the params and batch here, and, being the current table while init
  and the step are traced, the activations (`constrain`), the expert layer's shard_map and the
  optimizer state of an optimizer given logical-axis shardings (Muon from train/optimizer.py).
  """
  cfg: ModelConfig
  tx: optax.GradientTransformation
  mesh: Mesh
  rules: sharding.Rules = dataclasses.field(default_factory=lambda: sharding.RULES)
  qk_clip_tau: float = 0.0  # MuonClip threshold on per-head max attention logits; 0 disables.
  microbatches: int = 1     # Gradient accumulation: sequential microbatches per optimizer step.

  def __post_init__(self):
    self.tx = freeze_untrainable(self.tx)
    shapes = jax.eval_shape(lambda: transformer.init(self.cfg, jax.random.key(0)))
    self.param_shardings = sharding.tree_shardings(transformer.param_axes(self.cfg), shapes,
                                                   self.mesh, self.rules)
    self.batch_sharding = NamedSharding(self.mesh, sharding.spec(('act_batch',), self.rules))

  def with_rules(self, fn: Callable) -> Callable:
    """fn with this trainer's rules current: a jit of it traces (and caches) under them."""
    def traced(*args, **kwargs):
      with sharding.use_rules(self.rules):
        return fn(*args, **kwargs)
    return traced

  def jit(self, fn: Callable, **jit_kwargs) -> 'MeshJit':
    """jax.jit of fn traced under this trainer's rules; calls run inside its mesh."""
    return MeshJit(jax.jit(self.with_rules(fn), **jit_kwargs), self.mesh)

  def init(self, rng: jax.Array) -> TrainState:
    with jax.set_mesh(self.mesh):
      params = jax.jit(transformer.init, static_argnums=0,
                       out_shardings=self.param_shardings)(self.cfg, rng)
    return self.start(params)

  def start(self, params) -> TrainState:
    """Step 0 from given params (a warm start, a checkpoint), laid out by the param shardings."""
    params = jax.device_put(params, self.param_shardings)
    # Optimizer state follows the params' shardings (Muon constrains it by the rules).
    opt_state = self.jit(self.tx.init)(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(self.mesh, P()))
    state = TrainState(step, params, opt_state)
    self.state_shardings = jax.tree.map(lambda x: x.sharding, state)
    return state

  def step_fn(self, loss: Callable = loss_fn, batch_sharding=None) -> Callable:
    """The jitted train_step on `loss`; batch_sharding (a prefix of the batch's tree) defaults to
    every leaf split on its first axis over the batch mesh axes."""
    return self.jit(
        functools.partial(train_step, cfg=self.cfg, tx=self.tx, qk_clip_tau=self.qk_clip_tau, loss=loss,
                          microbatches=self.microbatches),
        in_shardings=(self.state_shardings, batch_sharding or self.batch_sharding, None),
        out_shardings=(self.state_shardings, NamedSharding(self.mesh, P())),  # Metrics: any host reads them.
        donate_argnums=0)

  def put_batch(self, batch: dict) -> dict:
    return jax.device_put(batch, self.batch_sharding)

  def put_global(self, tree, shardings=None):
    """Host arrays every process holds in full, alike (RL's rollouts), as global arrays laid out by
    `shardings` (a prefix of the tree; default the batch sharding). Device arrays pass through."""
    def put(x, sh):
      return x if isinstance(x, jax.Array) else jax.make_array_from_callback(x.shape, sh, lambda i: x[i])
    shardings = shardings or self.batch_sharding
    return jax.tree.map(lambda sh, sub: jax.tree.map(lambda x: put(x, sh), sub), shardings, tree,
                        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
