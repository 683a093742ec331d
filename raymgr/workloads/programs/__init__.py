"""The Python programs Ray workload jobs run on the cluster, shipped as the job's working-dir files.

`raymgr.workloads.scripts` reads them as text. They run on the cluster's Python (which may be older than
the control plane's: keep them to Python 3.8 syntax at run time) with the cluster's Ray, each next to its
``ctfleet_spec.json``; none imports torch unless the built-in fine-tune actually trains.
"""
