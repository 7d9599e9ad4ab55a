"""Grain pipelines: packing, segment ids, determinism, per-host shards, resumable state, readers."""

import json

import ml_collections
import numpy as np
import pytest

from research.data import pipeline
from research.data import readers
from research.data import synthetic

TEXTS = [f'def f{i}(x):\n  return x * {i}\n' * (1 + i % 5) for i in range(40)]


def _cfg(**kw):
  base = dict(source='synthetic', batch_size=8, seq_len=32, shards=4, train_files='', eval_files='',
              text_field='text')
  return ml_collections.ConfigDict({**base, **kw})


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_rows_are_packed_documents_with_segment_ids():
  b = next(pipeline.from_config(_cfg(), 'train', seed=0))
  assert {k: v.shape for k, v in b.items()} == {k: (8, 32) for k in
                                                ('tokens', 'targets', 'segment_ids', 'loss_mask')}
  seg = b['segment_ids']
  np.testing.assert_array_equal(b['loss_mask'], seg > 0)
  assert seg.max() > 1, 'several documents share a row'
  assert (b['loss_mask'].mean() > 0.8), 'little padding'
  for r in range(8):  # A target is the next token of the same document: targets[t] == tokens[t+1].
    same = (seg[r, 1:] == seg[r, :-1]) & (seg[r, 1:] > 0)
    np.testing.assert_array_equal(b['targets'][r, :-1][same], b['tokens'][r, 1:][same])
    # Every packed segment is a contiguous piece of a synthetic document: ends with EOS or is cut.
    for s in set(seg[r][seg[r] > 0]):
      piece = np.append(b['tokens'][r][seg[r] == s], b['targets'][r][seg[r] == s][-1])
      text = bytes(piece[piece != synthetic.EOS].astype(np.uint8)).decode()
      assert text.isprintable()


def test_long_documents_are_chunked_not_truncated():
  docs = [np.arange(1, 101, dtype=np.int32)]  # 100 tokens, rows of 32: 4 chunks cover 99 targets.
  import grain
  it = pipeline.Pipeline(grain.MapDataset.source(docs).repeat(), batch_size=4, seq_len=32, shards=1,
                         seed=0)
  rows = _take(it, 4)
  targets = np.concatenate([b['targets'][b['loss_mask'] > 0] for b in rows])
  assert set(range(2, 101)) <= set(targets.tolist())
  for b in rows:  # Chunks keep their order: inputs then targets, 1 apart.
    m = b['loss_mask'] > 0
    np.testing.assert_array_equal(b['targets'][m], b['tokens'][m] + 1)


def test_deterministic_by_seed():
  a, b, c = (_take(pipeline.from_config(_cfg(), 'train', seed=s), 3) for s in (0, 0, 1))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x['tokens'], y['tokens'])
  assert not np.array_equal(a[0]['tokens'], c[0]['tokens'])


def test_hosts_read_disjoint_rows_of_the_same_global_batch():
  whole = _take(pipeline.from_config(_cfg(), 'train', seed=0), 3)
  halves = [_take(pipeline.from_config(_cfg(), 'train', seed=0, host_rows=r), 3)
            for r in ((0, 4), (4, 8))]
  for i in range(3):
    for k in whole[i]:
      np.testing.assert_array_equal(np.concatenate([halves[0][i][k], halves[1][i][k]]), whole[i][k])
  with pytest.raises(ValueError, match='data.shards=4'):
    pipeline.from_config(_cfg(), 'train', seed=0, host_rows=(0, 3))


def test_state_resumes_exactly_even_on_another_host_layout():
  it = pipeline.from_config(_cfg(), 'train', seed=0)
  _take(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  expected = _take(it, 3)
  resumed = pipeline.from_config(_cfg(), 'train', seed=0)
  resumed.set_state(state)
  host1 = pipeline.from_config(_cfg(), 'train', seed=0, host_rows=(4, 8))
  host1.set_state(state)
  for e, r, h in zip(expected, _take(resumed, 3), _take(host1, 3)):
    np.testing.assert_array_equal(e['tokens'], r['tokens'])
    np.testing.assert_array_equal(e['tokens'][4:], h['tokens'])
  with pytest.raises(ValueError, match='data.shards'):
    pipeline.from_config(_cfg(shards=8), 'train', seed=0).set_state(state)


def test_eval_split_is_held_out_and_fixed():
  tr = next(pipeline.from_config(_cfg(), 'train', seed=0))['tokens']
  ev = [next(pipeline.from_config(_cfg(), 'eval', seed=0))['tokens'] for _ in range(2)]
  np.testing.assert_array_equal(ev[0], ev[1])
  assert not np.array_equal(tr, ev[0])


@pytest.mark.parametrize('source', ['jsonl', 'array_record'])
def test_file_readers(tmp_path, source):
  if source == 'jsonl':
    path = tmp_path / 'train.jsonl'
    path.write_text(''.join(json.dumps({'text': t, 'id': i}) + '\n' for i, t in enumerate(TEXTS)))
  else:
    path = tmp_path / 'train.array_record'
    readers.write_array_record(str(path), TEXTS)
  src = (readers.JsonlSource if source == 'jsonl' else readers.ArrayRecordSource)(str(path))
  assert len(src) == len(TEXTS) and src[7] == TEXTS[7]
  cfg = _cfg(source=source, train_files=str(path))
  rows = _take(pipeline.from_config(cfg, 'train', seed=0), 12)
  seen = b''.join(bytes(r['tokens'][r['loss_mask'] > 0].astype(np.uint8)) for r in rows)
  for t in TEXTS[:40:7]:  # Every document shows up (12 batches hold the corpus more than once).
    assert t.encode()[:20] in seen


def test_bad_files_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='nothing_here'):
    pipeline.from_config(_cfg(source='jsonl', train_files=str(tmp_path / 'nothing_here*.jsonl')),
                         'train', seed=0)
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"text": "ok"}\n{"body": "no text field"}\n')
  with pytest.raises(ValueError, match="bad.jsonl at byte 15.*'text'"):
    readers.JsonlSource(str(bad))[1]
  with pytest.raises(ValueError, match='data.source'):
    pipeline.from_config(_cfg(source='parquet', train_files='x'), 'train', seed=0)
