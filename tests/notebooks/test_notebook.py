"""notebooks/quickstart.ipynb runs top to bottom on the CPU."""

import json
import os

import nbclient
import nbformat

import runs

# Appended to the notebook: reports, from the kernel's variables, what the cells above produced.
PROBE = """
print(json.dumps({
    'samples': [tok.decode(row) for row in np.asarray(new)],
    'sample_shape': list(new.shape),
    'wi_gate_spec': list(state.params['moe_layers']['moe']['wi_gate'].sharding.spec),
    'losses': [r['loss'] for r in train_rows],
    'workdir': workdir,
    'files': sorted(os.listdir(workdir)),
    'checkpoints': sorted(os.listdir(f'{workdir}/checkpoints')),
}))
"""


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
  monkeypatch.setenv('TMPDIR', str(tmp_path))  # The notebook's workdir, from tempfile.mkdtemp.
  nb = nbformat.read(os.path.join(runs.ROOT, 'notebooks', 'quickstart.ipynb'), as_version=4)
  nb.cells.append(nbformat.v4.new_code_cell(PROBE))
  nbclient.NotebookClient(nb, timeout=300, kernel_name='python3',
                          resources={'metadata': {'path': runs.ROOT}}).execute()
  (out,) = [o for o in nb.cells[-1].outputs if o.get('name') == 'stdout']
  got = json.loads(out['text'])
  assert got['sample_shape'] == [2, 12] and all(isinstance(s, str) for s in got['samples'])
  assert got['wi_gate_spec'][1] == 'expert', 'experts sharded over the expert axis'
  assert 5 <= got['losses'][0] < 6 and got['losses'][-1] < 5, 'the loss fell'
  assert os.path.dirname(got['workdir']) == str(tmp_path)
  assert got['files'] == ['checkpoints', 'metrics.jsonl', 'tensorboard']
  assert got['checkpoints'] == ['10', '20']
