"""The agent's side of the tunnel: connecting, authenticating, heartbeats, frames, proxied streams.

Here: the tunnel client and its reconnect policy (`tunnel`) and the node-side end of proxied byte
streams (`proxy`). The wire format both sides speak is `agent.protocol`, not here.

Not here: what commands do on the node (`agent.runner`, `agent.executors`, `agent.workloads`,
`agent.ray`).
"""
