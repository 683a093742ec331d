#!/bin/bash
# The stack image's services (Debian packages), one per container:
#   postgres   PostgreSQL 15 on 5432; data in $PGDATA, made on first start with database $POSTGRES_DB and
#              password $POSTGRES_PASSWORD for user postgres (scram-sha-256 over TCP)
#   redis      Redis with the append-only file on (appendfsync everysec), data in /var/lib/redis;
#              $REDIS_PASSWORD, when set, is required of clients
#   proxy      HAProxy in master-worker mode with /etc/haproxy/haproxy.cfg; SIGUSR2 reloads the
#              configuration and certificates while the old worker finishes its connections (tunnels)
set -euo pipefail

case "${1:-}" in
  postgres)
    export PGDATA="${PGDATA:-/var/lib/postgresql/data/pgdata}"
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
      : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
      pwfile="$(mktemp)"
      printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
      initdb -D "$PGDATA" -U postgres -E UTF8 --locale=C.UTF-8 --pwfile="$pwfile" \
        --auth-local=peer --auth-host=scram-sha-256 >/dev/null
      rm -f "$pwfile"
      echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
      echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
      echo "CREATE DATABASE \"${POSTGRES_DB:-cleverthis}\"" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
    exec postgres -D "$PGDATA" -c max_connections="${POSTGRES_MAX_CONNECTIONS:-200}"
    ;;
  redis)
    exec redis-server --bind 0.0.0.0 --port 6379 --protected-mode no --dir /var/lib/redis \
      --appendonly yes --appendfsync everysec ${REDIS_PASSWORD:+--requirepass "$REDIS_PASSWORD"}
    ;;
  proxy)
    exec haproxy -W -db -f /etc/haproxy/haproxy.cfg
    ;;
  *)
    exec "$@"
    ;;
esac
