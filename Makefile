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

.PHONY: install lab test notebooks clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
ifeq ($(HAS_GPU),yes)
	$(BIN)/pip install "torch>=2.11"
else
	$(BIN)/pip install --retries 0 "torch==$(TORCH_VERSION)" --extra-index-url $(TORCH_CPU_INDEX)
endif
	$(BIN)/pip install -e ".[dev]"    # the distribution flashlab-course (import flashlab); dev includes the hf extra
	touch $@

## lab: set up and open the course in JupyterLab
lab: install
	$(BIN)/jupyter lab $(ROOT_FLAG) --notebook-dir=notebooks

## test: unit tests, exercise tests against solutions/, ruff, and nbval over every notebook
test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --impl=solutions

## notebooks: re-execute every notebook in place, top to bottom, in a fresh kernel
notebooks: install
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=1800 notebooks/[0-9]*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
