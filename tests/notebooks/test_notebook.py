"""notebooks/quickstart.ipynb runs top to bottom on the CPU."""

import os
import re

import nbclient
import nbformat

import runs


def test_quickstart_notebook_runs():
  path = os.path.join(runs.ROOT, 'notebooks', 'quickstart.ipynb')
  nb = nbformat.read(path, as_version=4)
  nbclient.NotebookClient(nb, timeout=300, kernel_name='python3',
                          resources={'metadata': {'path': runs.ROOT}}).execute()
  text = '\n'.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code' for o in c.outputs)
  assert "-> '" in text, 'samples printed'
  (wi_gate,) = [l for l in text.splitlines() if l.startswith('moe_layers/moe/wi_gate')]
  assert "'expert'" in wi_gate, 'experts sharded over the expert axis'
  assert re.search(r"loss 5\.\d+ -> [0-4]\.\d+", text), 'the loss fell'
  assert "['checkpoints', 'metrics.jsonl', 'tensorboard'] ['10', '20']" in text
