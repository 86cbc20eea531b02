#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster on loopback for the test suites and exports
# AIRLOCK_TEST_DATABASE_URL. Idempotent: reuses a running cluster, re-creates a broken one.
# Source it (`. .ci/postgres.sh`) so the export reaches the caller. Needs root (it runs the
# server as the `postgres` user) and Debian's `postgresql` package.
set -euo pipefail

# Below Linux's ephemeral range (32768-60999 by default): a port inside it can be taken, at
# the moment the server binds, by any outgoing connection's local end (seen on CI with 55432).
AIRLOCK_PG_PORT="${AIRLOCK_PG_PORT:-25432}"
read -r eph_lo eph_hi < /proc/sys/net/ipv4/ip_local_port_range || true
if [ -n "${eph_lo:-}" ] && [ "$AIRLOCK_PG_PORT" -ge "$eph_lo" ] && [ "$AIRLOCK_PG_PORT" -le "$eph_hi" ]; then
  echo "postgres.sh: port $AIRLOCK_PG_PORT is in the ephemeral range $eph_lo-$eph_hi; choose another (AIRLOCK_PG_PORT)" >&2
  return 1 2>/dev/null || exit 1
fi
AIRLOCK_PG_DIR="${AIRLOCK_PG_DIR:-/var/tmp/airlock-pg}"
AIRLOCK_PG_DB="${AIRLOCK_PG_DB:-airlock_test}"

pg_bin=""
for d in /usr/lib/postgresql/*/bin; do
  [ -x "$d/pg_ctl" ] && pg_bin="$d"
done
if [ -z "$pg_bin" ]; then
  echo "postgres.sh: PostgreSQL server binaries not found (apt-get install postgresql)" >&2
  return 1 2>/dev/null || exit 1
fi

as_pg() { runuser -u postgres -- "$@"; }

mkdir -p "$AIRLOCK_PG_DIR"
chown postgres:postgres "$AIRLOCK_PG_DIR"
chmod 700 "$AIRLOCK_PG_DIR"

# A cluster left running on another port (an older default) is stopped, then started on ours.
if as_pg "$pg_bin/pg_ctl" -D "$AIRLOCK_PG_DIR/data" status >/dev/null 2>&1 &&
  ! as_pg psql -h 127.0.0.1 -p "$AIRLOCK_PG_PORT" -U postgres -d postgres -qAt -c 'SELECT 1' >/dev/null 2>&1; then
  as_pg "$pg_bin/pg_ctl" -D "$AIRLOCK_PG_DIR/data" stop -m fast >/dev/null
fi
if ! as_pg "$pg_bin/pg_ctl" -D "$AIRLOCK_PG_DIR/data" status >/dev/null 2>&1; then
  if [ ! -f "$AIRLOCK_PG_DIR/data/PG_VERSION" ]; then
    rm -rf "$AIRLOCK_PG_DIR/data"
    as_pg "$pg_bin/initdb" -D "$AIRLOCK_PG_DIR/data" -U postgres --auth=trust \
      --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  fi
  rm -f "$AIRLOCK_PG_DIR/data/postmaster.pid"
  as_pg "$pg_bin/pg_ctl" -D "$AIRLOCK_PG_DIR/data" -l "$AIRLOCK_PG_DIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $AIRLOCK_PG_PORT -k $AIRLOCK_PG_DIR -c fsync=off -c max_connections=200" \
    start >/dev/null
fi

psql_() { as_pg psql -h 127.0.0.1 -p "$AIRLOCK_PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
if [ "$(psql_ -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$AIRLOCK_PG_DB'")" != "1" ]; then
  psql_ -d postgres -c "CREATE DATABASE $AIRLOCK_PG_DB"
fi

export AIRLOCK_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$AIRLOCK_PG_PORT/$AIRLOCK_PG_DB"
echo "postgres.sh: PostgreSQL ready at $AIRLOCK_TEST_DATABASE_URL"
