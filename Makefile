# FlashLab: the two commands of the README (lab, test) and one for authors (notebooks).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# On a machine without an NVIDIA GPU take PyTorch's CPU build (about 200 MB) rather than
# the default CUDA build (several GB). Retries are off so an unreachable index costs
# nothing: pip then falls back to the other indexes it knows.
TORCH_VERSION   ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: install lab test test-ex progress notebooks clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
ifeq ($(HAS_GPU),yes)
	$(BIN)/pip install "torch>=2.11"
else
	$(BIN)/pip install --retries 0 "torch==$(TORCH_VERSION)" --extra-index-url $(TORCH_CPU_INDEX)
endif
	$(BIN)/pip install -e ".[dev]"    # the distribution flashlab-course (import flashlab); dev includes the hf and rl4co extras
	touch $@

## lab: set up and open the course in JupyterLab
lab: install
	$(BIN)/jupyter lab $(ROOT_FLAG) --notebook-dir=notebooks

## test: unit tests, exercise tests against solutions/, ruff, and nbval over every notebook
# -n: pytest-xdist workers, one per core up to 4 (each holds its own PyTorch; notebooks run in kernels of their
# own); --durations: the 25 slowest tests, to keep the whole run within its time budget. conftest.py sends a notebook's cells to one worker in order and prints the exercise table as without -n.
TEST_WORKERS ?= auto --maxprocesses=4
test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --impl=solutions -n $(TEST_WORKERS) --durations=25

## test-ex: one exercise's tests against your exercises/, e.g. make test-ex EX=03 (EX=03b for 03b)
# --tb=short: a failure shows the failing lines and the message with its hint, not every helper's
# source and the tensors in its locals. -rs (test-ex only): why each test was skipped, e.g. "not started:
# add_kernel's body is still the stub's `pass`" (make progress would print that for every exercise).
# These only need the venv to exist (make lab / make install made it); they never (re)install.
NEED_VENV = @test -x $(BIN)/python || { echo "$(VENV)/: no virtual environment yet; run make install (or make lab) first"; exit 2; }
test-ex:
	$(NEED_VENV)
	@ls tests/exercises/test_ex$(EX)_*.py >/dev/null 2>&1 || { echo "EX=$(EX): no tests/exercises/test_ex$(EX)_*.py; say e.g. make test-ex EX=03 (or EX=03b)"; exit 2; }
	$(BIN)/python -m pytest -q -rs --tb=short tests/exercises/test_ex$(EX)_*.py

## progress: every exercise's tests against your exercises/ (IMPL=solutions: the answers), then the table
IMPL ?= exercises
progress:
	$(NEED_VENV)
	$(BIN)/python -m pytest -q --tb=short --impl=$(IMPL) tests/exercises/test_ex[0-9]*.py

## notebooks: re-execute every notebook in place, top to bottom, in a fresh kernel
notebooks: install
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=1800 notebooks/[0-9]*.ipynb
	# then one block per stream and cell: a kernel that flushed twice leaves two outputs, shown apart
	# (nbconvert merges streams before executing, not after, so it is a second pass)
	$(BIN)/jupyter nbconvert --coalesce-streams notebooks/[0-9]*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
