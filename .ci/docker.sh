#!/usr/bin/env bash
# A Docker daemon for the docker backend's suites, started here if none answers
# (idempotent: a running daemon is reused), with Debian's gVisor registered
# twice: `runsc` (gVisor's own network stack; fails on some kernels, which
# `airlock doctor` reports) and `runsc-host` (`--network=host`: the
# container's own network namespace). Then the backend's images, built from
# the workspace's `airlock` binary. Needs root and Debian's docker.io, runsc
# and mmdebstrap. Source it or run it.
set -euo pipefail

daemon_json=/etc/docker/daemon.json
want='{"runtimes": {"runsc": {"path": "/usr/bin/runsc"}, "runsc-host": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]}}}'
mkdir -p /etc/docker
if [ -x /usr/bin/runsc ] && ! grep -q '"runsc-host"' "$daemon_json" 2>/dev/null; then
  if [ -s "$daemon_json" ]; then
    # Keep what the operator configured; add the two runtimes.
    python3 - "$daemon_json" <<'PY'
import json, sys
p = sys.argv[1]
cfg = json.load(open(p))
rt = cfg.setdefault("runtimes", {})
rt.setdefault("runsc", {"path": "/usr/bin/runsc"})
rt["runsc-host"] = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]}
json.dump(cfg, open(p, "w"))
PY
  else
    echo "$want" > "$daemon_json"
  fi
  reload=1
fi

if ! docker version >/dev/null 2>&1; then
  echo "docker.sh: starting dockerd"
  (dockerd >/var/log/dockerd.log 2>&1 &)
  for _ in $(seq 1 150); do
    docker version >/dev/null 2>&1 && break
    sleep 0.2
  done
  docker version >/dev/null 2>&1 || { echo "docker.sh: dockerd did not start:"; tail -20 /var/log/dockerd.log; exit 1; }
elif [ "${reload:-0}" = 1 ]; then
  # A running daemon re-reads its runtimes on SIGHUP.
  kill -HUP "$(pidof dockerd)"
  for _ in $(seq 1 50); do
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc-host && break
    sleep 0.1
  done
fi
echo "docker.sh: $(docker version --format 'Docker {{.Server.Version}}, API {{.Server.APIVersion}}'); runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
