"""The GPU Muon benchmark's parts run at a tiny size on CPU and report sane numbers."""

from experiments.benchmarks import muon_gpu


def test_muon_gpu_small():
  ns = muon_gpu.ns_throughput((2,), 16, 32, reps=1)
  assert {(r['dtype'], r['coeffs']) for r in ns} == {
      (d, c) for d in ('bfloat16', 'float32') for c in ('standard', 'polar_express')}
  assert all(r['ms'] > 0 and r['tflops'] > 0 for r in ns)
  step = muon_gpu.optimizer_step(2, 32, 16, reps=1)
  assert set(step) == {'ours_bf16', 'ours_f32', 'optax'}
  assert all(r['ms'] > 0 for r in step.values())
