#!/usr/bin/env bash
# A Docker daemon for the docker backend's suites, started here if none answers
# (idempotent: a running daemon is reused), with Debian's gVisor registered
# twice: `runsc` (gVisor's own network stack; fails on some kernels, which
# `airlock doctor` reports) and `runsc-host` (`--network=host`: the
# container's own network namespace), both with `--host-uds=open` (an agent
# reaches its sidecar through unix sockets bound into its container, which
# gVisor refuses otherwise; the platform refuses a gVisor runtime without
# it). The backend's images are built by `.ci/run` after it (`airlock images
# build`, from the workspace's binary). Needs root and Debian's docker.io and
# runsc. Source it or run it.
set -euo pipefail

daemon_json=/etc/docker/daemon.json
mkdir -p /etc/docker
# Keep what the operator configured; add the two runtimes (when runsc is
# installed) and small address pools (the daemon's own networks and the
# test suites'). Prints "restart" when the address pools had to change (read
# at start only), "reload" when only the runtimes did (a SIGHUP reloads them:
# running containers are untouched).
changed=$(python3 - "$daemon_json" <<'PY'
import json, os, sys
p = sys.argv[1]
cfg = json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) > 0 else {}
before = json.dumps(cfg, sort_keys=True)
pools_before = json.dumps(cfg.get("default-address-pools"), sort_keys=True)
if os.access("/usr/bin/runsc", os.X_OK):
    rt = cfg.setdefault("runtimes", {})
    runsc = rt.setdefault("runsc", {"path": "/usr/bin/runsc"})
    if runsc.get("path") == "/usr/bin/runsc" and "--host-uds=open" not in runsc.get("runtimeArgs", []):
        runsc["runtimeArgs"] = runsc.get("runtimeArgs", []) + ["--host-uds=open"]
    rt["runsc-host"] = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--host-uds=open"]}
cfg.setdefault("default-address-pools", [{"base": "10.200.0.0/16", "size": 28}])
if json.dumps(cfg, sort_keys=True) != before:
    json.dump(cfg, open(p, "w"))
    print("restart" if json.dumps(cfg.get("default-address-pools"), sort_keys=True) != pools_before else "reload")
PY
)

if [ "$changed" = restart ] && docker version >/dev/null 2>&1; then
  echo "docker.sh: $daemon_json's address pools changed, restarting dockerd"
  pid=$(pidof dockerd)
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
elif [ "$changed" = reload ] && docker version >/dev/null 2>&1; then
  echo "docker.sh: $daemon_json's runtimes changed, reloading dockerd (SIGHUP)"
  kill -HUP "$(pidof dockerd)"
  # Reloaded once the daemon lists the new arguments.
  for _ in $(seq 1 150); do
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q -- '--host-uds=open' && break
    sleep 0.2
  done
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
