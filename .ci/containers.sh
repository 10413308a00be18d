#!/usr/bin/env bash
# Sets podman up for the container tests (tests/containers), as root, once:
# runc as the runtime (crun refuses a hybrid cgroup hierarchy), and resource
# limits a container may be given here.  A rootful podman sets RLIMIT_NOFILE
# and RLIMIT_NPROC to values above this machine's hard limits, which a process
# without CAP_SYS_RESOURCE cannot raise: runc then fails with "error setting
# rlimits".  The defaults written are the hard limits found here (nproc no
# higher than the kernel's pid_max).  An existing containers.conf is left
# alone unless it is this script's.
set -euo pipefail

conf=/etc/containers/containers.conf
mark="# written by sbus_relay's .ci/containers.sh"
if [ "$(id -u)" -ne 0 ] || ! command -v podman >/dev/null 2>&1; then
    exit 0
fi
if [ -e "$conf" ] && ! head -n 1 "$conf" | grep -qF "$mark"; then
    exit 0
fi
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
[ "$nofile" = unlimited ] && nofile=1048576
if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; then
    nproc=$pid_max
fi
runtime=runc
command -v runc >/dev/null 2>&1 || runtime=crun
mkdir -p /etc/containers
cat > "$conf.new" <<CONF
$mark: the runtime, and limits a rootful container can be given here.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "$runtime"
CONF
mv "$conf.new" "$conf"
