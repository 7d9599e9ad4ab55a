"""Typed configs: frozen dataclasses, built from and turned into ml_collections ConfigDicts.

    c = configs.to_config_dict(ExperimentConfig())   # experiments/*.py: every field, then overrides
    cfg = configs.from_dict(ExperimentConfig, c)      # the entry point: nested, checked, typed

A section is a frozen dataclass whose fields have defaults (a nested section is a dataclass
field); it may define `validate(self, path) -> self`, raising `invalid(...)` for a bad value, where
`path` is its dotted prefix ('optimizer.muon.'), so errors name the field as the command line does.
`from_dict` rejects unknown keys by their full dotted path. No JAX here: launchers and tests of the
configs alone stay light.
"""

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import ml_collections
from ml_collections import config_dict

T = TypeVar('T')


def invalid(path: str, value: Any, msg: str) -> ValueError:
  """The error of a bad field value: 'optimizer.muon.exchange='ring': expected one of ...'."""
  return ValueError(f'{path}={value!r}: {msg}')


def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _strip_optional(tp):
  """`X | None` -> X; anything else unchanged."""
  if typing.get_origin(tp) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1:
      return args[0]
  return tp


def _as_tuple(v):
  """Lists (a JSON round trip) back to tuples, nested ones too."""
  return tuple(_as_tuple(x) for x in v) if isinstance(v, (list, tuple)) else v


def _convert(tp, value, path: str):
  tp = _strip_optional(tp)
  if dataclasses.is_dataclass(tp):
    return from_dict(tp, value, path)
  if value is None:
    return None
  if typing.get_origin(tp) is tuple or tp is tuple:
    return _as_tuple(value)
  if tp is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value


def from_dict(cls: type[T], d: Mapping[str, Any] | ml_collections.ConfigDict | T, path: str = '') -> T:
  """`cls` from a (nested) dict, ConfigDict or `cls` instance (checked again).

  Unknown keys fail, named by their dotted path below `path` (e.g. 'optimizer.muon'); then each
  section's `validate` runs, innermost first.
  """
  if isinstance(d, cls):
    d = to_dict(d)
  if isinstance(d, ml_collections.ConfigDict):
    d = d.to_dict()
  prefix = f'{path}.' if path else ''
  if not isinstance(d, Mapping):
    raise ValueError(f'{path or "config"}: expected a section (a dict of fields), got {d!r}')
  hints = _hints(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(prefix + k for k in d if k not in names)
  if unknown:
    raise ValueError(f'unknown config field(s) {unknown}; {path or "the config"} has {names}')
  obj = cls(**{k: _convert(hints[k], v, prefix + k) for k, v in d.items()})
  return obj.validate(prefix) if hasattr(obj, 'validate') else obj


def to_dict(obj) -> dict[str, Any]:
  """A config dataclass as a nested plain dict (for JSON: checkpoint metadata, reports)."""
  return dataclasses.asdict(obj)


def to_config_dict(obj) -> ml_collections.ConfigDict:
  """A config dataclass as a nested ConfigDict holding every field.

  A field that is None by default becomes a typed placeholder, so the command line can still set it
  (`--config.optimizer.muon.spread_axes="('data',)"`).
  """
  out = ml_collections.ConfigDict()
  hints = _hints(type(obj))
  for f in dataclasses.fields(obj):
    v = getattr(obj, f.name)
    if dataclasses.is_dataclass(v):
      out[f.name] = to_config_dict(v)
    elif v is None:
      tp = _strip_optional(hints[f.name])
      out[f.name] = config_dict.placeholder(typing.get_origin(tp) or tp)
    else:
      out[f.name] = v
  return out
