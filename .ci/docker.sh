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
mkdir -p /etc/docker
# Keep what the operator configured; add the two runtimes (when runsc is
# installed) and small address pools: one network per run, 4096 of them, not
# Docker's default ~30. Prints "changed" when the file had to change.
changed=$(python3 - "$daemon_json" <<'PY'
import json, os, sys
p = sys.argv[1]
cfg = json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) > 0 else {}
before = json.dumps(cfg, sort_keys=True)
if os.access("/usr/bin/runsc", os.X_OK):
    rt = cfg.setdefault("runtimes", {})
    rt.setdefault("runsc", {"path": "/usr/bin/runsc"})
    rt["runsc-host"] = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]}
cfg.setdefault("default-address-pools", [{"base": "10.200.0.0/16", "size": 28}])
if json.dumps(cfg, sort_keys=True) != before:
    json.dump(cfg, open(p, "w"))
    print("changed")
PY
)

if [ "$changed" = changed ] && docker version >/dev/null 2>&1; then
  # Address pools are read at start only: restart the daemon.
  echo "docker.sh: $daemon_json changed, restarting dockerd"
  pid=$(pidof dockerd)
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
fi

if ! docker version >/dev/null 2>&1; then
  echo "docker.sh: starting dockerd"
  (dockerd >/var/log/dockerd.log 2>&1 &)
  for _ in $(seq 1 150); do
    docker version >/dev/null 2>&1 && break
    sleep 0.2
  done
  docker version >/dev/null 2>&1 || { echo "docker.sh: dockerd did not start:"; tail -20 /var/log/dockerd.log; exit 1; }
fi
echo "docker.sh: $(docker version --format 'Docker {{.Server.Version}}, API {{.Server.APIVersion}}'); runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
