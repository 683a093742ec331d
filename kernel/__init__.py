"""The shared base the apps import: API helpers, schema hooks, metrics, the Redis client, the event log, request
limits, `IllegalTransition`, the generic filterset and saving rows whose name may clash (`rows`).

A plain library, not a Django app: it imports no app (`tenancy`, `audit`, `fleet`,
`raymgr`) and nothing of the project root (`cleverthis`); of the agent it uses only `agent.protocol`.
"""
