"""Ray models (RayCluster, RayNode, jobs, deployments, experiments) arrive with the Ray issues."""
