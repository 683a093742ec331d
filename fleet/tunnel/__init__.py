"""The agent tunnel: transport between the control plane and its nodes' agents.

Here: the WebSocket consumer that terminates a tunnel (`consumer`), tunnel authentication
(`auth`), the channel-layer groups and message shapes every other process uses to reach a tunnel
(`groups`: the one seam domain code calls), the tunnels and inbox of this process
(`local_tunnels`), the batching of reports and heartbeats into shared writes (`batching`), and the
interface stream proxies plug into (`streams_seam`).

Not here: what a command or a node *means* (that is `fleet.services` and `fleet.models`), and proxied
HTTP (`fleet.proxy`, which rides on these tunnels and registers its stream handler with them at app
start; nothing here imports it).
"""
