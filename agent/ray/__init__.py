"""Ray on the node: head and worker processes or containers, and the Ray Job/Serve calls of workloads.

Here: the `ray.*` command handler (`commands`), how Ray nodes run as host processes or containers
(`runtime`), and training/Tune/Serve calls against a head's Job API (`jobs`). Never imports Django.

Not here: the control plane's Ray clusters and autoscaler (`raymgr`), containers and endpoints that are
not Ray (`agent.executors`, `agent.workloads`).
"""
