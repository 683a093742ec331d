"""The agent tunnel: transport between the control plane and its nodes' agents.

Here: the WebSocket consumer that terminates a tunnel (`consumer`), tunnel authentication
(`auth`), the channel-layer groups and message shapes every other process uses to reach a tunnel
(`groups`: the one seam domain code calls), the tunnels and inbox of this process
(`local_tunnels`), the batching of reports and heartbeats into shared writes (`batching`), the
interface stream proxies use (`streams_seam`), and peer links, through which other control-plane
processes open streams to the tunnels this one holds (`peer_wire`: their one schema, `peer_link`: the
connection, `peer_listener`: this process's listener and address, `peer_serving`: the streams).

Not here: what a command or a node *means* (that is `fleet.services` and `fleet.models`), and proxied
HTTP (`fleet.proxy`, which rides on these tunnels and opens peer links to them; nothing here imports it).
"""
