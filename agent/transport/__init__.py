"""The agent's side of the tunnel: connecting, authenticating, heartbeats, frames, proxied streams.

Here: the tunnel client, its sessions and reconnect policy (`tunnel`), a session's send queue
(`sender`), the handling of commands that arrive (`commands`), the agent updating itself
(`self_update`), the supervision of a session's tasks (`supervision`) and the node-side end of proxied
byte streams (`proxy`). The wire format both sides speak is `agent.protocol`, not here.

Not here: what commands do on the node (`agent.runner`, `agent.executors`, `agent.workloads`,
`agent.ray`).
"""
