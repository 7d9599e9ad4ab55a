"""The rollout engine: vLLM behind a JSON-lines protocol on two pipes (research/rl/rollout/vllm_client.py).

    .venv-vllm/bin/python -m research.rl.rollout.vllm_engine.server --fds=R,W --engine='{...}'

Token ids in and out (the engine has no tokenizer). Each request is one JSON line, answered by one
line, {"error": traceback} on failure:
  {"op": "generate", "prompts": [[id]], "max_tokens": [n], "seeds": [s], "temperature": t,
   "top_k": k, "top_p": p, "stop_ids": [id]}   -> {"ids": [[id]], "logp": [[x]]}, prompt by prompt
  {"op": "logprobs", "prompts": [[id]]}        -> {"logp": [[x]]}: each token's log-prob after the
                                                  ones before it (the first token's is 0)
  {"op": "load", "folder": path}               -> {"seconds": s}: weights reloaded in place from a
                                                  safetensors folder, prefix cache reset
  {"op": "close"}                              -> {} and the process exits.
Once the engine is up it writes {"ready": true, "version": vLLM's}. Sampled log-probs are the
engine's `logprobs_mode` ones (the client asks for the tempered, truncated distribution's).
"""

import argparse
import json
import os
import time
import traceback

# The engine core in this process (no second process, no ZMQ): the client already isolates it.
os.environ.setdefault('VLLM_ENABLE_V1_MULTIPROCESSING', '0')

import vllm  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

WORKER_EXTENSION = 'research.rl.rollout.vllm_engine.worker.WeightLoader'


def _prompts(ids_list):
  return [TokensPrompt(prompt_token_ids=ids) for ids in ids_list]


def generate(llm: vllm.LLM, req: dict) -> dict:
  # ignore_eos: only the client's stop ids end a message, as in ours (the folder names no eos anyway).
  params = [vllm.SamplingParams(max_tokens=n, seed=seed, temperature=req['temperature'], top_k=req['top_k'],
                                top_p=req['top_p'], stop_token_ids=req['stop_ids'], ignore_eos=True,
                                logprobs=0, detokenize=False)
            for n, seed in zip(req['max_tokens'], req['seeds'])]
  outs = llm.generate(_prompts(req['prompts']), params, use_tqdm=False)
  ids, logp = [], []
  for o in outs:
    c = o.outputs[0]
    ids.append(list(c.token_ids))
    logp.append([step[t].logprob for step, t in zip(c.logprobs, c.token_ids)])
  return {'ids': ids, 'logp': logp}


def logprobs(llm: vllm.LLM, req: dict) -> dict:
  params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
  outs = llm.generate(_prompts(req['prompts']), params, use_tqdm=False)
  return {'logp': [[0.0] + [step[t].logprob for step, t in zip(o.prompt_logprobs[1:], ids[1:])]
                   for o, ids in zip(outs, req['prompts'])]}


def load(llm: vllm.LLM, req: dict) -> dict:
  t0 = time.perf_counter()
  llm.collective_rpc('load_folder', args=(req['folder'],))
  llm.reset_prefix_cache()  # Cached prefixes hold the old weights' keys and values.
  return {'seconds': time.perf_counter() - t0}


OPS = {'generate': generate, 'logprobs': logprobs, 'load': load}


def serve(llm: vllm.LLM, rx, tx) -> None:
  for line in rx:
    req = json.loads(line)
    if req['op'] == 'close':
      tx.write('{}\n')
      tx.flush()
      return
    try:
      out = OPS[req['op']](llm, req)
    except Exception:  # noqa: BLE001 - the client raises it with the engine's traceback.
      out = {'error': traceback.format_exc()}
    tx.write(json.dumps(out) + '\n')
    tx.flush()


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument('--fds', required=True, help='R,W: the request and reply pipes')
  ap.add_argument('--model', required=True, help='the Hugging Face folder of the first weights')
  ap.add_argument('--engine', required=True, help='vllm.LLM keyword arguments, as JSON')
  a = ap.parse_args()
  r, w = (int(x) for x in a.fds.split(','))
  with os.fdopen(r, 'r') as rx, os.fdopen(w, 'w') as tx:
    llm = vllm.LLM(model=a.model, skip_tokenizer_init=True, worker_extension_cls=WORKER_EXTENSION,
                   **json.loads(a.engine))
    tx.write(json.dumps({'ready': True, 'version': vllm.__version__}) + '\n')
    tx.flush()
    serve(llm, rx, tx)


if __name__ == '__main__':
  main()
