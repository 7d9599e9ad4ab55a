"""Conversion streams: peak RSS above baseline stays under twice the largest shard (subprocess)."""

from experiments.benchmarks import convert_memory


def test_import_and_export_stay_under_twice_the_largest_shard(tmp_path):
  # ~60 MiB in 12 MiB shards, fused experts (read in pieces); export writes per-expert tensors.
  info = convert_memory.make_folder(str(tmp_path / 'hf'), convert_memory.model_config(48), 12 << 20,
                                    layout='fused')
  assert info['shards'] >= 5 and info['folder_bytes'] > 4 * info['largest_shard_bytes']
  for direction, src, dst in (('import', 'hf', 'ckpt'), ('export', 'ckpt', 'out')):
    m = convert_memory.measure(direction, str(tmp_path / src), str(tmp_path / dst), 12 << 20)
    print(direction, m, info)
    assert m['above_baseline_bytes'] < 2 * info['largest_shard_bytes'], (direction, m, info)
  out = convert_memory.st.Folder(str(tmp_path / 'out'))
  assert len(out.shards) >= 5 and max(out.shard_sizes().values()) <= info['largest_shard_bytes']
