"""The command load of `bench/web_roll.py`, in a process of its own: one command a second to a random node of
the cluster and a fan-out to every online node each `--fanout-every` s, through the service an API call
uses (`fleet.services.command_dispatch`), until stdin closes.

    python bench/roll_commands.py --cluster <pk> --user <pk> --fanout-every 10

Runs on the bench's database and Redis (`BENCH_DB`, `REDIS_URL` from the environment, as the bench sets
them). One JSON line a second on stdout: `{"t": <epoch s>, "sent": <commands created>, "refused": [<error>],
"took_s": <seconds the sends took>, "online": <nodes online>}`. Which phase a command belongs to is read
later from its `created_at`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tunnel_dispatch  # noqa: F401  (django.setup() on the bench database)


def main() -> None:
    from django.contrib.auth import get_user_model

    from fleet import services
    from fleet.models import ComputeCluster, Node

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--user", type=int, required=True)
    parser.add_argument("--fanout-every", type=float, default=10.0, help="0: no fan-out")
    args = parser.parse_args()
    user = get_user_model().objects.get(pk=args.user)
    cluster = ComputeCluster.objects.get(pk=args.cluster)
    nodes = list(Node.objects.filter(cluster=cluster))
    rng = random.Random(7)
    stdin = selectors.DefaultSelector()
    stdin.register(sys.stdin, selectors.EVENT_READ)
    next_fanout = time.monotonic() + args.fanout_every
    while True:
        started = time.monotonic()
        targets: list[object] = [rng.choice(nodes)]
        if args.fanout_every and started >= next_fanout:
            targets.append(None)  # every online node
            next_fanout += args.fanout_every
        sent, refused = 0, []
        for node in targets:
            try:
                sent += len(
                    services.command_dispatch(
                        actor=user,
                        cluster=cluster,
                        command_type="model.download",
                        payload={"model_id": "acme/tiny"},
                        node=node,
                    )
                )
            except Exception as exc:  # the call failed: an API client would have seen an error
                refused.append(repr(exc)[:120])
        took = time.monotonic() - started
        online = Node.objects.filter(cluster=cluster, status="online").count()
        line = {"t": time.time(), "sent": sent, "refused": refused, "took_s": round(took, 3), "online": online}
        print(json.dumps(line), flush=True)
        if stdin.select(timeout=max(0.0, 1.0 - (time.monotonic() - started))) and not os.read(0, 4096):
            break  # stdin closed: the bench ends the load


if __name__ == "__main__":
    main()
