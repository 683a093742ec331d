"""The HTTP/WebSocket proxy through agent tunnels: node content reached via the control plane.

Here: the ASGI relay of HTTP (`relay`) and of WebSockets (`websocket_relay`), the registry of resolvers
and their answers (`resolvers`), the headers that may cross (`headers`), the proxy's own short answers
(`answers`), the ticket exchange on a node origin (`tickets`), the origins of their own that node content
is served on and how members get in there (`origins`), endpoint routing (`endpoint_routes`),
byte streams over a tunnel with credit flow control (`streams`), where a node's tunnel is held
(`peer_routes`) and the peer links this process opens to the process holding it (`peer_dialer`),
backpressure behind daphne's `send` (`write_pressure`; uvicorn's `send` waits itself), and start-up
checks of the origin domains (`site_checks`).

Not here: tunnel sessions themselves and the serving end of peer links (`fleet.tunnel`), or the rows
being routed to (endpoints live in `fleet.workloads`, Ray dashboards and Serve routes register their
resolvers from `raymgr`).
"""
