# Two entry points (README.md): `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= -m "not slow"

.PHONY: run test install lint clean

# Created only when missing.  Debian splits venv support into python3-venv:
# install it (as root) if creating the venv fails, then try once more.
$(PY):
	python3 -m venv $(VENV) || { rm -rf $(VENV); \
	  if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv </dev/null; fi; \
	  python3 -m venv $(VENV); }

# Editable installs: code changes need no reinstall, so each is redone only when
# pyproject.toml changes (a stamp file per set of extras).
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

run: install
	$(VENV)/bin/sbus-relay serve -c configs/default.yaml -f

test: $(VENV)/.installed-dev
	bash .ci/system-deps.sh
	$(VENV)/bin/ruff check sbus_relay tests
	$(VENV)/bin/ruff format --check sbus_relay tests
	$(VENV)/bin/mypy sbus_relay
	$(VENV)/bin/pytest $(PYTEST_ARGS)
	# The Spark cluster test is slow (about 2 minutes) but CI runs it anyway.
	$(VENV)/bin/pytest -m "slow and spark"

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check sbus_relay tests
	$(VENV)/bin/ruff format --check sbus_relay tests
	$(VENV)/bin/mypy sbus_relay

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
