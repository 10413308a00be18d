#!/usr/bin/env bash
# System packages the test suite needs beyond Python, installed with apt-get
# only when missing and only as root (otherwise the tests that need them skip
# with a loud reason):
#   prometheus, promtool   tests/metrics: a real Prometheus scrapes real buses
#   java (JRE 17+)         tests/pipeline: PySpark runs on the JVM
#   gcc, Python headers    the bus's compiled helper (bus/_batchio.c) and the
#                          benchmark's C load generator (tests/bench)
#   libnats-dev,           the NATS link's nats.c engine (link/_natsc.pyx) and the
#   pkg-config             fleet benchmark's C NATS clients (bench/csrc/natsload.c)
#   systemd-analyze,       tests/deploy: the units verified, and the master's
#   systemd-socket-activate  socket activation run (systemd need not be PID 1)
#   docker-compose         tests/deploy: validates the compose file (no daemon)
#   tmux                   tests/metrics/test_top.py: the live view in a real terminal
#   podman, runc,          tests/containers: the image built on a Debian base made
#   debootstrap            with debootstrap, relays and masters in real containers
#                          (.ci/containers.sh sets podman up for this machine)
set -euo pipefail

missing=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v systemd-analyze >/dev/null 2>&1 && command -v systemd-socket-activate >/dev/null 2>&1 \
    || missing+=(systemd)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists libnats 2>/dev/null || missing+=(libnats-dev)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
python3 - <<'PY' || missing+=(python3-dev)
import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY

here=$(dirname "$0")
if [ ${#missing[@]} -eq 0 ]; then
    bash "$here/containers.sh"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: missing ${missing[*]} and cannot apt-get install them here;" \
         "the tests that need them will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq </dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
bash "$here/containers.sh"
