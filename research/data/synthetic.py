"""A small synthetic corpus the code generates itself, and fixed-length packed batches of it.

Documents are short byte-level texts with learnable structure (sums, sorting, copying, counting),
so a tiny model's loss falls within minutes on a CPU and never plateaus at the unigram entropy.
"""

import numpy as np

BYTE_VOCAB = 256
EOS = 0  # NUL never appears in the generated text.


def _doc(rng: np.random.Generator) -> str:
  kind = rng.integers(4)
  if kind == 0:
    a, b = rng.integers(0, 100, size=2)
    return f'{a}+{b}={a + b}'
  if kind == 1:
    xs = rng.integers(0, 10, size=rng.integers(3, 7))
    return 'sort ' + ' '.join(map(str, xs)) + ' -> ' + ' '.join(map(str, sorted(xs)))
  if kind == 2:
    word = ''.join(rng.choice(list('abcdefghij'), size=rng.integers(3, 8)))
    return f'copy {word} {word}'
  start = int(rng.integers(0, 50))
  return 'count ' + ' '.join(str(start + i) for i in range(int(rng.integers(3, 7))))


def documents(seed: int):
  """Infinite, deterministic stream of byte-token documents, each ended by EOS."""
  rng = np.random.default_rng(seed)
  while True:
    yield np.frombuffer(_doc(rng).encode(), np.uint8).astype(np.int32).tolist() + [EOS]


def document(seed: int, index: int) -> np.ndarray:
  """Document `index` of corpus `seed`, int32 and EOS-terminated: random access for grain."""
  text = _doc(np.random.default_rng((seed, index)))
  return np.append(np.frombuffer(text.encode(), np.uint8).astype(np.int32), EOS)


def packed_batches(seed: int, batch_size: int, seq_len: int):
  """Yields {'tokens', 'targets', 'segment_ids', 'loss_mask'} int32 arrays of shape B x T.

  Documents are packed into rows; segment ids (1, 2, ...) keep attention within a document, and
  the loss skips the target of a row's last token when the next document does not fit.
  """
  docs = documents(seed)
  pending = next(docs)
  while True:
    rows = {k: np.zeros((batch_size, seq_len + 1), np.int32) for k in ('tokens', 'segment_ids')}
    for r in range(batch_size):
      filled, seg = 0, 1
      while filled < seq_len + 1:
        take = pending[: seq_len + 1 - filled]
        rows['tokens'][r, filled:filled + len(take)] = take
        rows['segment_ids'][r, filled:filled + len(take)] = seg
        filled += len(take)
        pending = pending[len(take):] or next(docs)
        seg += 1
    tok, seg = rows['tokens'], rows['segment_ids']
    yield {'tokens': tok[:, :-1], 'targets': tok[:, 1:], 'segment_ids': seg[:, :-1],
           'loss_mask': (seg[:, 1:] == seg[:, :-1]).astype(np.int32)}
