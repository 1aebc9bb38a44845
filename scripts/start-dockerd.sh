#!/usr/bin/env bash
# Start a throwaway Docker engine as root, all of its state under one directory, so tests and
# CI need no system service. Prints shell `export` lines; eval them to point clients at it.
# Usage: scripts/start-dockerd.sh [DIR]   (default: /tmp/agentd-dockerd)
# Stop:  kill "$(cat DIR/dockerd.pid)"
set -euo pipefail

dir=${1:-/tmp/agentd-dockerd}
sock="$dir/docker.sock"
mkdir -p "$dir"

if ! command -v dockerd >/dev/null || ! command -v busybox >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "dockerd missing and not root: cannot apt-get install" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends docker.io busybox-static >&2
fi

ready() { DOCKER_HOST="unix://$sock" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# Idempotent: a second call against a live engine only reprints the exports.
if ! ready; then
    [ "$(id -u)" = 0 ] || { echo "dockerd needs root" >&2; exit 1; }
    # No bridge and no iptables: containers get loopback only, which is what tools default to
    # (network none), and the engine is ready in ~0.5 s instead of ~3 s with nothing left behind.
    nohup dockerd \
        --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
        -H "unix://$sock" --iptables=false --ip6tables=false --bridge=none \
        >"$dir/dockerd.log" 2>&1 &
    for _ in $(seq 1 150); do
        ready && break
        sleep 0.1
    done
    ready || { echo "dockerd did not become ready; see $dir/dockerd.log" >&2; tail -20 "$dir/dockerd.log" >&2; exit 1; }
fi

echo "export DOCKER_HOST=unix://$sock"
echo "export AGENTD_DOCKERD_PIDFILE=$dir/dockerd.pid"
