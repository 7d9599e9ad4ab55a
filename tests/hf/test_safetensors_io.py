"""Our streaming safetensors reader / writer against the reference implementation."""

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from research.hf import safetensors_io as st

TORCH = {np.dtype(np.float32): torch.float32, np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
         np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn, np.dtype(np.int64): torch.int64}


def _tensors(seed=0):
  rng = np.random.RandomState(seed)
  return {'b.bf16': rng.randn(5, 3, 4).astype(ml_dtypes.bfloat16),
          'a.f32': rng.randn(7).astype(np.float32),
          'c.fp8': rng.randn(6, 8).astype(ml_dtypes.float8_e4m3fn),
          'd.i64': rng.randint(0, 9, (2, 2)).astype(np.int64)}


def _to_torch(x):
  return torch.from_numpy(x.view(np.uint8).copy()).view(TORCH[x.dtype]).reshape(x.shape)


def test_written_file_loads_in_reference(tmp_path):
  xs = _tensors()
  path = str(tmp_path / 'x.safetensors')
  w = st.ShardWriter(path, [(k, v.shape, v.dtype) for k, v in xs.items()])
  for k, v in xs.items():
    if v.ndim == 3:  # In pieces of the leading axis, as export writes fused experts.
      w.write(k, v[:2])
      w.write(k, v[2:])
    else:
      w.write(k, v)
  w.close()
  ref = load_file(path)
  assert sorted(ref) == sorted(xs)
  for k, v in xs.items():
    assert torch.equal(ref[k], _to_torch(v)), k


def test_reads_reference_file(tmp_path):
  xs = _tensors(1)
  path = str(tmp_path / 'y.safetensors')
  save_file({k: _to_torch(v) for k, v in xs.items()}, path)
  with st.ShardReader(path) as r:
    assert set(r.keys()) == set(xs)
    for k, v in xs.items():
      got = r.read(k)
      assert got.dtype == v.dtype and np.array_equal(got.view(np.uint8), v.view(np.uint8)), k
    np.testing.assert_array_equal(r.read('b.bf16', 1, 4), xs['b.bf16'][1:4])


def test_writer_rejects_out_of_order_or_wrong_shape(tmp_path):
  w = st.ShardWriter(str(tmp_path / 'z.safetensors'), [('a', (2, 3), np.float32), ('b', (4,), np.float32)])
  with pytest.raises(st.SafetensorsError, match='expected a'):
    w.write('b', np.zeros(4, np.float32))
  with pytest.raises(st.SafetensorsError, match=r'expected a \(2, 3\)'):
    w.write('a', np.zeros((2, 4), np.float32))
  w.write('a', np.zeros((2, 3), np.float32))
  with pytest.raises(st.SafetensorsError, match='never written'):
    w.close()


def test_truncated_file_is_named(tmp_path):
  path = tmp_path / 't.safetensors'
  save_file({'w': torch.zeros(64, 64)}, str(path))
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(st.SafetensorsError, match="'w' is truncated"):
    st.ShardReader(str(path))


def test_plan_shards():
  specs = [(f't{i}', (256,), np.float32) for i in range(10)]  # 1 KiB each.
  shards = st.plan_shards(specs, 3 * 1024)
  assert [len(s) for s in shards] == [3, 3, 3, 1]
  assert st.plan_shards([('big', (4096,), np.float32)], 1024) == [[('big', (4096,), np.float32)]]
  assert st.shard_names(2) == ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']
