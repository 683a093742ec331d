"""Ray on the node: head and worker processes or containers, and the Ray Job/Serve calls of workloads.

Here: the `ray.*` command handler (`commands`) and one backend per runtime (`backends`: host processes,
docker containers, KubeRay), their building blocks (`ports`, `start_args`, `process_runtime`, `gcs`,
`versions`, `docker_spec`, `containers`, `members`; `runtime` re-exports the older names), the program run
inside Ray containers (`incontainer`), and training/Tune/Serve calls against a head's Job API (`jobs`).
Never imports Django.

Not here: the control plane's Ray clusters and autoscaler (`raymgr`), containers and endpoints that are
not Ray (`agent.executors`, `agent.workloads`).
"""
