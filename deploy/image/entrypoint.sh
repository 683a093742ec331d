#!/bin/bash
# The control-plane image's entry point: one process per container, chosen by the first argument.
# web, worker and beat first wait (SCHEMA_WAIT_S, 600) until the database is migrated.
#   web        uvicorn (pages, API, admin, the agent tunnel, node origins) on $PORT (8000), behind a proxy:
#              WEB_CONCURRENCY processes (default: the CPUs this container may use) on one socket; the
#              client's address comes from X-Forwarded-For only when the proxy is one of TRUSTED_PROXIES
#              (the application reads it, kernel.client_address: uvicorn trusts no proxy header); SIGTERM
#              drains first (WEB_DRAIN_DEADLINE_S at most: cleverthis/graceful.py), then uvicorn waits as
#              long again for the requests still running
#   worker     the Celery worker (dispatch, drain, GitOps)
#   beat       Celery beat: run exactly one
#   migrate    apply migrations and exit (the release step; safe to run while an older release serves)
#   manage ... any manage.py command (createsuperuser, bootstrap_demo, ...)
#   healthcheck web|worker   exit 0 when the process in this container is healthy
# Anything else is run as given. Restarting a process that died is the container engine's job
# (restart policy); nothing here restarts anything.
set -euo pipefail
cd /app

# Prometheus multiprocess files belong to this container's processes only: start empty.
reset_metrics() {
  rm -rf "${PROMETHEUS_MULTIPROC_DIR:?}" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
}

# The release step may start with the database (a compose stack's first start): give it a minute.
wait_for_database() {
  local deadline=$((SECONDS + ${DATABASE_WAIT_S:-60}))
  until python -c 'import os, psycopg; psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=3).close()' 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "migrate: the database at DATABASE_URL does not answer" >&2
      return 1
    fi
    sleep 1
  done
}

# web, worker and beat start once the release step has migrated the database, whatever starts them
# (compose without dependency conditions, a Kubernetes rollout racing its migrate Job): they wait for it.
wait_for_schema() {
  local deadline=$((SECONDS + ${SCHEMA_WAIT_S:-600}))
  until python manage.py migrate --check >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$1: the database is unreachable or not migrated (run the migrate step)" >&2
      return 1
    fi
    echo "$1: waiting for the database and its migrations" >&2
    sleep 2
  done
}

case "${1:-web}" in
  web)
    shift || true
    wait_for_schema web
    reset_metrics
    exec uvicorn cleverthis.asgi:application --host 0.0.0.0 --port "${PORT:-8000}" \
      --workers "${WEB_CONCURRENCY:-$(nproc)}" --backlog 2048 --loop uvloop --http httptools \
      --ws cleverthis.uvicorn_fixes:ClosingHandshakeProtocol --ws-per-message-deflate false --ws-max-size 4194304 \
      --ws-ping-interval "${TUNNEL_PING_INTERVAL_S:-10}" --ws-ping-timeout "${TUNNEL_PING_TIMEOUT_S:-20}" \
      --lifespan off --no-access-log --no-server-header --no-date-header \
      --no-proxy-headers --timeout-graceful-shutdown "${WEB_DRAIN_DEADLINE_S:-30}" \
      "$@"
    ;;
  worker)
    shift
    wait_for_schema worker
    reset_metrics
    exec celery -A cleverthis worker -Q default,dispatch,gitops --loglevel="${LOG_LEVEL:-INFO}" \
      --concurrency="${WORKER_CONCURRENCY:-2}" "$@"
    ;;
  beat)
    shift
    wait_for_schema beat
    reset_metrics
    exec celery -A cleverthis beat --loglevel="${LOG_LEVEL:-INFO}" "$@"
    ;;
  migrate)
    shift
    wait_for_database
    exec python manage.py migrate --noinput "$@"
    ;;
  manage)
    shift
    exec python manage.py "$@"
    ;;
  healthcheck)
    case "${2:-web}" in
      web)
        # the process answers and reaches the database (a replica whose worker is gone stays healthy)
        exec python -c 'import os, sys, urllib.request
r = urllib.request.urlopen("http://127.0.0.1:%s/healthz" % os.environ.get("PORT", "8000"), timeout=5)
sys.exit(0 if r.status == 200 else 1)'
        ;;
      worker)
        # the worker answers a ping over the broker
        exec celery -A cleverthis inspect ping --timeout 5 -d "celery@$(hostname)"
        ;;
      *) echo "healthcheck: web or worker" >&2; exit 2 ;;
    esac
    ;;
  *)
    exec "$@"
    ;;
esac
