"""Usage metering: endpoint requests, errors, tokens and latency per workspace, endpoint and API key (counted
by the proxy, `meter`), node-, GPU- and container-hours per cluster (sampled each minute, `services`),
kept as minute and hour rollups in PostgreSQL and shown on the Usage page, the API, CSV and /metrics."""
