"""Fleet models (compute clusters, nodes, commands) arrive with the fleet-core issue."""
