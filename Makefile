# The front door: `make run` and `make test` on a fresh machine with Python 3.11; the Makefile builds
# its own virtual environment in .venv and installs what it needs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# The stamp names the dependency file's content, so editing pyproject.toml reinstalls.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test install clean

run: $(STAMP)
	$(PY) -m engine generate --model demo --prompt "The list type" --max-tokens 64 --temperature 0

test: $(STAMP)
	$(PY) -m pytest

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=/path/to/python3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache
