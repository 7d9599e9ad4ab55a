# `make test` and `make demo` work from a clean clone: they create .venv and install pinned deps.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: test demo install sysdeps clean

# System packages some tests need (bubblewrap for the grading sandbox); installed through apt.
sysdeps:
	@command -v bwrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }

$(STAMP): requirements.lock pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.lock
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP) sysdeps
	$(VPY) -m pytest -n 2 --dist loadfile tests

demo: $(STAMP)
	$(VPY) -m launch.train --config=experiments/tiny_moe.py --workdir=$${WORKDIR:-/tmp/demo_tiny_moe}

clean:
	rm -rf $(VENV)
