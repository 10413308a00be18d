#!/usr/bin/env bash
# System packages the test suite needs beyond Python: a real Prometheus
# (tests/metrics).  Installed with apt-get only when missing and only as root;
# otherwise those tests skip themselves.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "system-deps: prometheus/promtool missing and not root; skipping (those tests will skip)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: no apt-get; install prometheus yourself to run tests/metrics" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update </dev/null
apt-get install -y --no-install-recommends prometheus </dev/null
