"""The Backoff a connect storm is sent and the offline grace agree: an agent refused right after its tunnel
closed is back, its own jitter included, before its node would read offline.

The Backoff is derived from NODE_OFFLINE_GRACE_S (`fleet.tunnel.handshakes.handshake_backoff_range`), the
agent stretches it by up to `protocol.BACKOFF_JITTER` (`ReconnectPolicy.after_backoff`). It was 5-15 s plus
20 % against a 10 s grace: nodes went offline in every roll.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest
from django.utils import timezone

from agent import protocol as p
from agent.transport.tunnel import ReconnectPolicy
from fleet import services
from fleet.models import Node, NodeStatus
from fleet.tunnel.handshakes import HANDSHAKE_ALLOWANCE_S, handshake_backoff_range, handshake_backoff_s


class _Highest(random.Random):
    """The agent's random draw at its highest (the worst case of its jitter)."""

    def random(self) -> float:
        return 1.0


@pytest.mark.parametrize("grace", [5, 10, 30, 90])
def test_the_longest_backoff_with_the_agents_jitter_and_a_handshake_fits_the_grace(settings, grace):
    settings.NODE_OFFLINE_GRACE_S = grace
    shortest, longest = handshake_backoff_range()
    assert 0 < shortest < longest
    worst = ReconnectPolicy(rng=_Highest()).after_backoff(longest)
    assert worst == pytest.approx(longest * (1 + p.BACKOFF_JITTER))
    assert worst + HANDSHAKE_ALLOWANCE_S <= grace + 1e-9
    sent = [handshake_backoff_s() for _ in range(500)]
    assert all(shortest <= s <= longest for s in sent)
    assert max(sent) - min(sent) > (longest - shortest) / 2  # spread over the window, not one value


def test_the_agent_never_waits_less_than_asked_nor_more_than_its_jitter():
    policy = ReconnectPolicy(rng=random.Random(7))
    waits = [policy.after_backoff(4.0) for _ in range(1000)]
    assert all(4.0 <= w <= 4.0 * (1 + p.BACKOFF_JITTER) for w in waits)


@pytest.mark.django_db
def test_a_node_whose_agent_waits_out_the_longest_backoff_is_not_taken_offline(settings, cluster, register_node):
    settings.NODE_OFFLINE_GRACE_S = 10
    node = register_node(cluster)
    services.node_disconnected(node=node)
    worst = ReconnectPolicy(rng=_Highest()).after_backoff(handshake_backoff_range()[1]) + HANDSHAKE_ALLOWANCE_S
    # The agent has been away that long (a refusal, the longest Backoff, its jitter, the handshake): the
    # lost-nodes pass at that moment leaves the node online, and the reconnect finds it so.
    closed_at = timezone.now() - dt.timedelta(seconds=worst - 0.01)
    Node.objects.filter(pk=node.pk).update(disconnected_at=closed_at)
    assert services.nodes_mark_lost_offline() == 0
    assert Node.objects.get(pk=node.pk).status == NodeStatus.ONLINE
