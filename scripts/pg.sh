#!/usr/bin/env bash
# Install (Debian's packages), start a local PostgreSQL server and create the roles and the
# database used by the PostgreSQL half of the test suite. Idempotent; run as root.
#
# Two roles (issue 12): $PG_USER owns the tables and runs the migrations (`duplex-ledger db
# upgrade`, then `duplex-ledger db grant $PG_APP_USER`); $PG_APP_USER is the application role,
# with only SELECT/INSERT on events (and what the read models need): it cannot UPDATE, DELETE,
# TRUNCATE, or DISABLE/DROP the append-only triggers (only a table's owner can).
#
# Prints export lines; the LAST line is always the one for DUPLEX_LEDGER_TEST_PG_URL (the
# owner role, with CREATEDB), which .ci/run evaluates. The line before it exports
# DUPLEX_LEDGER_TEST_PG_APP_URL (the application role) for the role tests.
#
# `scripts/pg.sh --binaries` only installs the server binaries (initdb, pg_ctl) when they are
# missing, through sudo when not root, and starts nothing: the README's test command runs it,
# and the test session then starts a throwaway cluster of its own (tests/pg_cluster.py).
set -euo pipefail

if [ "${1:-}" = "--binaries" ]; then
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
    exit 0
  fi
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
  exit 0
fi

PG_USER=${PG_USER:-ledger}
PG_PASS=${PG_PASS:-ledger}
PG_DB=${PG_DB:-ledger_test}
PG_APP_USER=${PG_APP_USER:-ledger_app}
PG_APP_PASS=${PG_APP_PASS:-ledger_app}

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

ver=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$ver main"; then
  pg_createcluster "$ver" main >/dev/null
fi
if ! pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $4}' | grep -q online; then
  pg_ctlcluster "$ver" main start
fi
port=$(pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $3}')
for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$port" && break
  sleep 0.5
done

psql_su() { su postgres -c "psql -p $port -v ON_ERROR_STOP=1 -tAc \"$1\""; }
if [ "$(psql_su "SELECT 1 FROM pg_roles WHERE rolname='$PG_USER'")" != "1" ]; then
  psql_su "CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASS' CREATEDB" >/dev/null
fi
if [ "$(psql_su "SELECT 1 FROM pg_roles WHERE rolname='$PG_APP_USER'")" != "1" ]; then
  psql_su "CREATE ROLE $PG_APP_USER LOGIN PASSWORD '$PG_APP_PASS' NOCREATEDB NOCREATEROLE" >/dev/null
fi
if [ "$(psql_su "SELECT 1 FROM pg_database WHERE datname='$PG_DB'")" != "1" ]; then
  psql_su "CREATE DATABASE $PG_DB OWNER $PG_USER" >/dev/null
fi

echo "export DUPLEX_LEDGER_TEST_PG_APP_URL=postgresql+asyncpg://$PG_APP_USER:$PG_APP_PASS@127.0.0.1:$port/$PG_DB"
echo "export DUPLEX_LEDGER_TEST_PG_URL=postgresql+asyncpg://$PG_USER:$PG_PASS@127.0.0.1:$port/$PG_DB"
