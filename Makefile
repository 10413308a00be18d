# Two entry points (README.md): `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= -m "not slow"

.PHONY: run test test-slow install lint clean system-deps dist

# Created only when missing.  Debian splits venv support into python3-venv,
# which the README's line of system packages installs: as root it is
# installed here when missing; as anyone else one line says so.
$(PY):
	@command -v python3 >/dev/null || { echo "make: python3 is missing: install it first, as root:" \
	  "apt-get install python3-venv" >&2; exit 1; }
	@python3 -m venv $(VENV) >/dev/null 2>&1 || { rm -rf $(VENV); \
	  if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv </dev/null && \
	    python3 -m venv $(VENV); \
	  else \
	    echo "make: python3 -m venv failed: install Python's venv first, as root:" \
	      "apt-get install python3-venv" >&2; exit 1; \
	  fi; }

# Editable installs: code changes need no reinstall, so each is redone only when
# pyproject.toml or what is compiled changes: the C helper and the hot path's
# modules with their .pxd files (sbus_relay/accel.py lists them; a stamp file
# per set of extras).  A checkout edited since runs pure Python until then.
PXD := $(wildcard sbus_relay/*/_c_*.pxd)
COMPILED_SOURCES := $(PXD) $(foreach p,$(PXD),$(dir $(p))$(patsubst _c_%.pxd,%.py,$(notdir $(p))))
BUILT := pyproject.toml setup.py sbus_relay/accel.py sbus_relay/bus/_batchio.c sbus_relay/link/_natsc.pyx $(COMPILED_SOURCES)
$(VENV)/.installed: $(BUILT) | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BUILT) | $(PY)
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $@ $(VENV)/.installed

# Prometheus, a JRE, gcc and the Python headers, when missing (as root); before
# the install, so that the bus's compiled helper is built.
system-deps:
	bash .ci/system-deps.sh

install: $(VENV)/.installed

run: install
	$(VENV)/bin/sbus-relay serve -C configs/default.yaml -f

# The suite but the tests marked slow runs on the compiled hot path (and the
# NATS link on nats.c, where libnats is); then the protocol, the server, the
# relays and the NATS fleet once more on the pure-Python path (the link on
# nats-py); then
# the two slow Spark tests (the standalone cluster, the class archive).
test: system-deps $(VENV)/.installed-dev
	$(VENV)/bin/ruff check sbus_relay tests grafana docs/overview.py
	$(VENV)/bin/ruff format --check sbus_relay tests grafana docs/overview.py
	$(VENV)/bin/mypy sbus_relay
	$(VENV)/bin/mypy --strict sbus_relay/protocol sbus_relay/bus grafana/dashboard.py
	$(VENV)/bin/pytest $(PYTEST_ARGS)
	SBUS_PURE_PYTHON=1 $(VENV)/bin/pytest -m "not slow" tests/unit tests/server tests/relay \
	  tests/nats/test_fleet.py tests/nats/test_identities.py tests/nats/test_link_process.py
	$(VENV)/bin/pytest -m "slow and spark"  # the standalone-cluster test, a few minutes

# Every test marked slow: the bench's quick run of every scenario, the
# full-length hardening runs (fuzz, faults, load, soak) and the slow Spark tests.
test-slow: system-deps $(VENV)/.installed-dev
	$(VENV)/bin/pytest -m slow

# An sdist and a wheel with the hot path compiled (CONTRIBUTING.md, "The
# wheel"); auditwheel makes the wheel manylinux, bundling any shared library
# an extension links outside the policy, where it can; else the linux wheel
# stays, and its line says why.
dist: $(VENV)/.installed-dev
	rm -rf dist
	$(PY) -m build --outdir dist .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair --wheel-dir dist dist/*-linux_*.whl \
	  && rm dist/*-linux_*.whl \
	  || echo "make dist: no manylinux wheel (auditwheel's reason above); dist/ keeps the linux one"
	ls dist

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check sbus_relay tests grafana docs/overview.py
	$(VENV)/bin/ruff format --check sbus_relay tests grafana docs/overview.py
	$(VENV)/bin/mypy sbus_relay
	$(VENV)/bin/mypy --strict sbus_relay/protocol sbus_relay/bus grafana/dashboard.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
