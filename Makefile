# The two commands of the README. Each installs what it needs first.
#   make demo   install, then the demo: train a small ASCender char-LM vs plain attention, write Fig. 1 and Fig. 4
#   make test   install, then the C kernel tests (ASan/UBSan) and the whole pytest suite
#   make bench  install, then the forward and forward+backward benchmark tables

PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install demo test test-c test-py bench clean

install:
	$(PIP) install --quiet torch==2.13.0 pytest numpy safetensors "transformers>=4.53" matplotlib setuptools wheel
	$(PIP) install --quiet --no-build-isolation -e .

demo: install
	$(PYTHON) examples/demo.py

test: install test-c test-py

test-c:
	$(MAKE) -C tests/c check

test-py:
	$(PYTHON) -m pytest -q

bench: install
	$(PYTHON) benchmarks/bench_forward.py
	$(PYTHON) benchmarks/bench_backward.py

clean:
	$(MAKE) -C tests/c clean
	rm -rf build *.egg-info ascender_torch/*.so
