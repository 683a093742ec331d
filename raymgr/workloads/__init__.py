"""Ray workloads: training jobs, Tune experiments and Serve deployments on managed Ray clusters."""
