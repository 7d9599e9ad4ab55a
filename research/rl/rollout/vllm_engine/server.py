"""The rollout engine: vLLM behind a JSON-lines protocol (research/rl/rollout/vllm_client.py).

    # Started by the run, on two pipes, from a folder on this host:
    .venv-vllm/bin/python -m research.rl.rollout.vllm_engine.server --fds=R,W --model=DIR --engine='{...}'
    # A fleet's engine on its own host (or accelerator), waiting for a trainer (rollout.vllm_engines):
    .venv-vllm/bin/python -m research.rl.rollout.vllm_engine.server --listen=HOST:PORT

Token ids in and out (the engine has no tokenizer). Each request is one JSON line, answered by one
line, {"error": traceback} on failure:
  {"op": "generate", "prompts": [[id]], "max_tokens": [n], "seeds": [s], "temperature": t,
   "top_k": k, "top_p": p, "stop_ids": [id]}   -> {"ids": [[id]], "logp": [[x]]}, prompt by prompt
  {"op": "logprobs", "prompts": [[id]]}        -> {"logp": [[x]]}: each token's log-prob after the
                                                  ones before it (the first token's is 0)
  {"op": "load", "folder": path}               -> {"seconds": s}: weights reloaded in place from a
                                                  safetensors folder on this host, prefix cache reset
  {"op": "push", "files": [[name, size]]}      -> {"seconds": s}: the same from the files' bytes,
                                                  which follow the line in that order
  {"op": "start", "engine": {...}, "files": ...} -> {"ready": true, "version": v}: --listen's first
                                                  request: the engine started from the files (a
                                                  Hugging Face folder); once started, a reload
  {"op": "close"}                              -> {} and the connection (pipes: the process) ends.
With --fds the engine starts at once and then writes {"ready": true, "version": vLLM's}. With
--listen it prints {"listening": "HOST:PORT"} and serves one trainer connection at a time (a
trainer that restarts connects again and gets the running engine). Sampled log-probs are the
engine's `logprobs_mode` ones (the client asks for the tempered, truncated distribution's).
"""

import argparse
import json
import os
import shutil
import socket
import tempfile
import time
import traceback

# The engine core in this process (no second process, no ZMQ): the client already isolates it.
os.environ.setdefault('VLLM_ENABLE_V1_MULTIPROCESSING', '0')

import vllm  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

WORKER_EXTENSION = 'research.rl.rollout.vllm_engine.worker.WeightLoader'


class Engine:
  """The vLLM engine this process serves (None until --listen's 'start') and its weights' folder."""

  def __init__(self, folder: str, llm: vllm.LLM | None = None, args: dict | None = None):
    self.folder, self.llm, self.args = folder, llm, args


def start_llm(folder: str, engine_args: dict) -> vllm.LLM:
  return vllm.LLM(model=folder, skip_tokenizer_init=True, worker_extension_cls=WORKER_EXTENSION, **engine_args)


def _prompts(ids_list):
  return [TokensPrompt(prompt_token_ids=ids) for ids in ids_list]


def generate(e: Engine, req: dict) -> dict:
  # ignore_eos: only the client's stop ids end a message, as in ours (the folder names no eos anyway).
  params = [vllm.SamplingParams(max_tokens=n, seed=seed, temperature=req['temperature'], top_k=req['top_k'],
                                top_p=req['top_p'], stop_token_ids=req['stop_ids'], ignore_eos=True,
                                logprobs=0, detokenize=False)
            for n, seed in zip(req['max_tokens'], req['seeds'])]
  outs = e.llm.generate(_prompts(req['prompts']), params, use_tqdm=False)
  ids, logp = [], []
  for o in outs:
    c = o.outputs[0]
    ids.append(list(c.token_ids))
    logp.append([step[t].logprob for step, t in zip(c.logprobs, c.token_ids)])
  return {'ids': ids, 'logp': logp}


def logprobs(e: Engine, req: dict) -> dict:
  params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
  outs = e.llm.generate(_prompts(req['prompts']), params, use_tqdm=False)
  return {'logp': [[0.0] + [step[t].logprob for step, t in zip(o.prompt_logprobs[1:], ids[1:])]
                   for o, ids in zip(outs, req['prompts'])]}


def load(e: Engine, folder: str) -> dict:
  t0 = time.perf_counter()
  e.llm.collective_rpc('load_folder', args=(folder,))
  e.llm.reset_prefix_cache()  # Cached prefixes hold the old weights' keys and values.
  return {'seconds': time.perf_counter() - t0}


def push(e: Engine, req: dict) -> dict:
  if e.llm is None:
    raise RuntimeError("no engine yet: a trainer's first request is 'start'")
  return load(e, e.folder)


def start(e: Engine, req: dict) -> dict:
  if e.llm is None:
    e.llm, e.args = start_llm(e.folder, req['engine']), req['engine']
  elif req['engine'] != e.args:
    raise RuntimeError(f'this engine runs with {e.args}, the trainer asks for {req["engine"]}: restart the '
                       'server for other engine arguments')
  else:
    load(e, e.folder)  # A trainer that connects again: its weights, in place.
  return {'ready': True, 'version': vllm.__version__}


OPS = {'generate': generate, 'logprobs': logprobs, 'load': lambda e, req: load(e, req['folder']),
       'push': push, 'start': start}


def receive(rx, files: list, folder: str) -> None:
  """Reads the files that follow a request line into `folder` (which then holds only them)."""
  names = [name for name, _ in files]
  bad = [n for n in names if not n or n != os.path.basename(n) or n.startswith('.')]
  if not bad:
    for old in set(os.listdir(folder)) - set(names):
      os.remove(os.path.join(folder, old))
  for name, size in files:
    with open(os.devnull if bad else os.path.join(folder, name), 'wb') as f:
      left = size
      while left:
        chunk = rx.read(min(left, 1 << 22))
        if not chunk:
          raise EOFError(f'the connection ended inside {name}')
        f.write(chunk)
        left -= len(chunk)
  if bad:
    raise ValueError(f'file names must be plain names: {bad}')


def serve(e: Engine, rx, tx) -> bool:
  """Answers requests until 'close' (returns True) or the end of rx (False)."""
  for line in rx:
    req = json.loads(line)
    if req['op'] == 'close':
      tx.write(b'{}\n')
      tx.flush()
      return True
    try:
      if 'files' in req:  # Read first, so that the stream stays in step whatever fails next.
        receive(rx, req['files'], e.folder)
      out = OPS[req['op']](e, req)
    except EOFError:
      return False
    except Exception:  # noqa: BLE001 - the client raises it with the engine's traceback.
      out = {'error': traceback.format_exc()}
    tx.write(json.dumps(out).encode() + b'\n')
    tx.flush()
  return False


def listen(address: str) -> None:
  host, port = address.rsplit(':', 1)
  folder = tempfile.mkdtemp(prefix='vllm_engine_', dir='/dev/shm' if os.path.isdir('/dev/shm') else None)
  e = Engine(folder)
  try:
    with socket.create_server((host, int(port))) as srv:
      print(json.dumps({'listening': '%s:%d' % srv.getsockname()[:2]}), flush=True)
      while True:
        conn, _ = srv.accept()
        with conn, conn.makefile('rb') as rx, conn.makefile('wb') as tx:
          try:
            serve(e, rx, tx)
          except OSError:  # The trainer went away mid-reply: wait for the next one.
            pass
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument('--fds', help='R,W: the request and reply pipes (an engine started by the run)')
  ap.add_argument('--model', help='with --fds: the Hugging Face folder of the first weights')
  ap.add_argument('--engine', help='with --fds: vllm.LLM keyword arguments, as JSON')
  ap.add_argument('--listen', help='HOST:PORT: serve trainers that connect there (a fleet engine)')
  a = ap.parse_args()
  if a.listen:
    listen(a.listen)
    return
  r, w = (int(x) for x in a.fds.split(','))
  with os.fdopen(r, 'rb') as rx, os.fdopen(w, 'wb') as tx:
    e = Engine(a.model, start_llm(a.model, json.loads(a.engine)))
    tx.write(json.dumps({'ready': True, 'version': vllm.__version__}).encode() + b'\n')
    tx.flush()
    serve(e, rx, tx)


if __name__ == '__main__':
  main()
