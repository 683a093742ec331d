"""The HTTP/WebSocket proxy through agent tunnels: node content reached via the control plane.

Here: the ASGI relay and its resolvers registry (`relay`), the origins of their own that node content
is served on and how members get in there (`origins`), endpoint routing (`endpoint_routes`),
byte streams over a tunnel with credit flow control (`streams`), the Redis lists that carry a
stream's bytes between replicas (`stream_pipes`), backpressure behind daphne's `send`
(`write_pressure`; uvicorn's `send` waits itself), and the hook-up to the tunnel's stream seam at app start (`wiring`).

Not here: tunnel sessions themselves (`fleet.tunnel`) or the rows being routed to (endpoints live in
`fleet.workloads`, Ray dashboards and Serve routes register their resolvers from `raymgr`).
"""
