"""vLLM worker extension: reloads the weights in place from a safetensors folder on local disk.

The folder holds Hugging Face names (research/hf writes it from our params); vLLM's own in-place
reload maps them onto its fused layers and redoes their kernel formats. On the CPU the MoE experts'
grouped-GEMM packing is done only at the first load in vLLM 0.32 (a weight update copies the raw
layout into the packed buffers, which silently mixes the layouts), so it is redone here.
"""

import glob
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open
from vllm.platforms import current_platform


def _tensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
  for path in sorted(glob.glob(os.path.join(folder, '*.safetensors'))):
    with safe_open(path, 'pt') as f:
      for name in f.keys():
        yield name, f.get_tensor(name)


class WeightLoader:
  """Mixed into each vLLM worker (`worker_extension_cls`); called through `collective_rpc`."""

  def load_folder(self, folder: str) -> None:
    self.model_runner.reload_weights(weights_iterator=_tensors(folder))
    if current_platform.is_cpu():
      for m in self.model_runner.model.modules():
        kernel = getattr(getattr(m, 'quant_method', None), 'moe_kernel', None)
        if kernel is not None:
          kernel.fused_experts.process_weights_after_loading(m)
