"""The vLLM engine process: run by the vLLM venv's python (`make vllm-venv`), never imported by the
project's processes. It imports only vllm, torch and the standard library (no jax, no numpy of ours)."""
