"""The autoscaler decision function: packing, bounds, idle removal, reasons, and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raymgr.autoscaler import ClusterDemand, Decision, ScalingPolicy, WorkerState, decide, fits

CPU1 = {"CPU": 1.0}
SHAPE = {"CPU": 2.0, "memory": 4.0}


def busy(worker_id: str, free: dict[str, float] | None = None, shape: dict[str, float] = SHAPE) -> WorkerState:
    return WorkerState(worker_id, idle_s=0.0, resources=shape, available=free if free is not None else {})


def idle(worker_id: str, idle_s: float, shape: dict[str, float] = SHAPE) -> WorkerState:
    return WorkerState(worker_id, idle_s=idle_s, resources=shape)


def demand(*bundles: dict[str, float], head_free: dict[str, float] | None = None) -> ClusterDemand:
    return ClusterDemand(pending=list(bundles), head_free=head_free or {}, worker_shape=SHAPE)


def test_policy_validates_its_bounds():
    with pytest.raises(ValueError, match="max_workers"):
        ScalingPolicy(min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="min_workers"):
        ScalingPolicy(min_workers=-1, max_workers=2)
    with pytest.raises(ValueError, match="idle_timeout_s"):
        ScalingPolicy(min_workers=0, max_workers=2, idle_timeout_s=0)
    with pytest.raises(ValueError, match="max_step_up"):
        ScalingPolicy(min_workers=0, max_workers=2, max_step_up=0)
    assert ScalingPolicy().idle_timeout_s == 60


def test_fits_compares_every_requested_resource():
    assert fits({"CPU": 1, "GPU": 0}, {"CPU": 1})
    assert not fits({"CPU": 1, "GPU": 1}, {"CPU": 4})
    assert fits({"CPU": 0.1 + 0.2}, {"CPU": 0.3})


def test_no_demand_no_workers_is_steady_with_a_reason():
    d = decide(ScalingPolicy(min_workers=0, max_workers=3), [], demand())
    assert (d.add, d.remove) == (0, [])
    assert not d.changes
    assert d.reasons == ["no change: 0 live worker(s) (min 0, max 3), no pending demand"]


def test_pending_that_fits_on_head_adds_nothing():
    d = decide(ScalingPolicy(max_workers=3), [], demand(CPU1, head_free={"CPU": 1}))
    assert d.add == 0
    assert "pending work fits free capacity" in d.summary()


def test_pending_beyond_head_capacity_adds_one_worker():
    # Two 1-CPU tasks, the head has one CPU free: one bundle needs a new 2-CPU worker.
    d = decide(ScalingPolicy(max_workers=3), [], demand(CPU1, CPU1, head_free={"CPU": 1}))
    assert d.add == 1
    assert d.remove == []
    assert "1 pending bundle(s) exceed free capacity: need 1 more worker(s) of {CPU: 2, memory: 4}" in d.reasons
    assert "adding 1 worker(s)" in d.reasons


def test_bundles_are_packed_several_per_new_worker():
    # Five 1-CPU bundles on 2-CPU workers: three workers, not five.
    d = decide(ScalingPolicy(max_workers=10), [], demand(*[CPU1] * 5))
    assert d.add == 3


def test_first_fit_decreasing_packs_mixed_sizes_tightly():
    # 1.5 + 0.5 and 1.5 + 0.5 → two workers (first-fit in given order would use three).
    bundles = [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 1.5}, {"CPU": 1.5}]
    assert decide(ScalingPolicy(max_workers=10), [], demand(*bundles)).add == 2


def test_free_capacity_on_existing_workers_is_used_first():
    workers = [busy("w1", free={"CPU": 1, "memory": 2}), busy("w2", free={"CPU": 1, "memory": 2})]
    d = decide(ScalingPolicy(max_workers=5), workers, demand(CPU1, CPU1))
    assert d.add == 0
    d = decide(ScalingPolicy(max_workers=5), workers, demand(CPU1, CPU1, CPU1))
    assert d.add == 1


def test_bundle_larger_than_worker_shape_never_adds_and_says_so():
    d = decide(ScalingPolicy(max_workers=5), [], demand({"GPU": 1}, {"CPU": 3}))
    assert d.add == 0
    assert d.infeasible == [{"GPU": 1}, {"CPU": 3}] or d.infeasible == [{"CPU": 3}, {"GPU": 1}]
    text = d.summary()
    assert "pending bundle {GPU: 1} is larger than the worker shape {CPU: 2, memory: 4}" in text
    assert "pending bundle {CPU: 3} is larger than the worker shape" in text


def test_infeasible_bundle_that_fits_the_head_is_not_infeasible():
    d = decide(ScalingPolicy(max_workers=5), [], demand({"GPU": 1}, head_free={"GPU": 1}))
    assert (d.add, d.infeasible) == (0, [])


def test_zero_resource_bundles_never_add():
    assert decide(ScalingPolicy(max_workers=5), [], demand({"CPU": 0})).add == 0


def test_below_min_adds_up_to_min_without_demand():
    d = decide(ScalingPolicy(min_workers=2, max_workers=4), [busy("w1")], demand())
    assert d.add == 1
    assert d.reasons[:2] == ["below min_workers: 1 live < 2", "adding 1 worker(s)"]


def test_min_fill_workers_also_serve_pending_demand():
    # Min wants 2 new workers; 3 pending bundles fit on those 2: add 2, not 4.
    d = decide(ScalingPolicy(min_workers=2, max_workers=5), [], demand(CPU1, CPU1, CPU1))
    assert d.add == 2
    # More demand than min covers: demand wins.
    d = decide(ScalingPolicy(min_workers=2, max_workers=5), [], demand(*[CPU1] * 6))
    assert d.add == 3


def test_at_max_pending_work_queues():
    workers = [busy("w1"), busy("w2")]
    d = decide(ScalingPolicy(max_workers=2), workers, demand(CPU1, CPU1, CPU1))
    assert d.add == 0
    assert d.remove == []
    assert d.queued == 3
    assert "pending work queues: at max_workers (2); 3 bundle(s) wait in Ray" in d.reasons
    assert d.reasons[-1] == "no change: 2 live worker(s) (min 0, max 2), 3 pending bundle(s) queued"


def test_near_max_adds_only_up_to_max_and_the_rest_queues():
    d = decide(ScalingPolicy(max_workers=3), [busy("w1")], demand(*[CPU1] * 8))
    assert d.add == 2
    assert d.queued == 4
    assert "pending work queues: at max_workers (3); 4 bundle(s) wait in Ray" in d.reasons


def test_step_limit_bounds_demand_driven_growth():
    d = decide(ScalingPolicy(max_workers=50, max_step_up=3), [], demand(*[CPU1] * 20))
    assert d.add == 3
    assert d.queued == 14
    assert "step limit: at most 3 worker(s) per pass; 14 bundle(s) wait" in d.reasons


def test_step_limit_never_slows_filling_min():
    assert decide(ScalingPolicy(min_workers=6, max_workers=8, max_step_up=2), [], demand()).add == 6


def test_draining_workers_count_towards_max_but_not_capacity_or_min():
    workers = [WorkerState("w1", idle_s=90, resources=SHAPE, draining=True), busy("w2")]
    d = decide(ScalingPolicy(min_workers=2, max_workers=2), workers, demand(CPU1))
    # Below min (1 live) but at max counting the draining one: wait for the drain to finish.
    assert d.add == 0
    assert d.remove == []
    assert "1 worker(s) draining" in d.reasons
    assert "cannot reach min_workers now: at max_workers (2) counting draining" in d.reasons
    d = decide(ScalingPolicy(min_workers=2, max_workers=3), workers, demand(CPU1))
    assert d.add == 1


def test_starting_workers_count_as_capacity_so_a_pass_does_not_add_twice():
    starting = WorkerState("w-new", idle_s=0, resources=SHAPE, starting=True)
    d = decide(ScalingPolicy(max_workers=3), [starting], demand(CPU1, CPU1))
    assert d.add == 0


def test_idle_worker_past_timeout_is_removed_with_reason():
    d = decide(ScalingPolicy(max_workers=3), [busy("w1"), idle("w2", 61)], demand())
    assert d.add == 0
    assert d.remove == ["w2"]
    assert d.reasons == ["removing worker w2: idle 61s > 60s and not needed by pending work"]
    assert d.changes


def test_idle_worker_within_timeout_is_kept():
    d = decide(ScalingPolicy(max_workers=3), [idle("w1", 60)], demand())
    assert d.remove == []


def test_custom_idle_timeout():
    assert decide(ScalingPolicy(max_workers=3, idle_timeout_s=3), [idle("w1", 3.5)], demand()).remove == ["w1"]


def test_never_removes_below_min_and_prefers_the_longest_idle():
    workers = [idle("a", 100), idle("b", 500), idle("c", 300), busy("d")]
    d = decide(ScalingPolicy(min_workers=2, max_workers=5), workers, demand())
    assert d.remove == ["b", "c"]
    assert "keeping idle worker a (idle 100s): min_workers is 2" in d.reasons


def test_idle_worker_needed_by_pending_work_is_kept():
    # The pending bundle fits only on the idle worker: it is about to be used, do not remove it.
    d = decide(ScalingPolicy(max_workers=3), [busy("w1"), idle("w2", 500)], demand(CPU1))
    assert (d.add, d.remove) == (0, [])


def test_pending_work_packs_onto_the_least_idle_so_the_longest_idle_goes():
    workers = [idle("short", 70), idle("long", 700)]
    d = decide(ScalingPolicy(max_workers=3), workers, demand(CPU1))
    assert d.remove == ["long"]


def test_never_removes_while_adding():
    workers = [busy("w1"), idle("w2", 999, shape={"CPU": 1.0})]
    # A 2-CPU bundle cannot use the idle 1-CPU worker and needs a new one.
    d = decide(ScalingPolicy(max_workers=5), workers, ClusterDemand(pending=[{"CPU": 2}], worker_shape=SHAPE))
    assert d.add == 1
    assert d.remove == []


def test_workers_above_a_lowered_max_are_removed_when_idle_even_before_timeout():
    workers = [busy("a"), idle("b", 5), idle("c", 10)]
    d = decide(ScalingPolicy(max_workers=1), workers, demand())
    assert d.add == 0
    assert d.remove == ["c", "b"]
    assert "removing idle worker c: 3 live workers exceed max_workers (1)" in d.reasons


def test_duplicate_worker_ids_are_refused():
    with pytest.raises(ValueError, match="unique"):
        decide(ScalingPolicy(max_workers=3), [idle("a", 1), idle("a", 2)], demand())


def test_decision_is_pure():
    workers = [busy("w1", free={"CPU": 1}), idle("w2", 90)]
    dem = demand(CPU1, {"CPU": 2}, head_free={"CPU": 0.5})
    first = decide(ScalingPolicy(max_workers=4), workers, dem)
    assert decide(ScalingPolicy(max_workers=4), workers, dem) == first
    assert workers[0].available == {"CPU": 1}
    assert dem.head_free == {"CPU": 0.5}


# --- invariants over random clusters ---------------------------------------------------------------

amounts = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
bundles = st.dictionaries(st.sampled_from(["CPU", "GPU", "memory"]), amounts, max_size=3)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ScalingPolicy, list[WorkerState], ClusterDemand]:
    min_workers = draw(st.integers(0, 4))
    policy = ScalingPolicy(
        min_workers=min_workers,
        max_workers=draw(st.integers(min_workers, 8)),
        idle_timeout_s=draw(st.sampled_from([3.0, 60.0])),
        max_step_up=draw(st.integers(1, 5)),
    )
    shape = draw(st.sampled_from([{"CPU": 1.0}, {"CPU": 2.0, "memory": 4.0}, {"CPU": 4.0, "GPU": 1.0}]))
    workers = []
    for index in range(draw(st.integers(0, policy.max_workers))):
        draining = draw(st.booleans()) and draw(st.booleans())
        starting = not draining and draw(st.booleans()) and draw(st.booleans())
        idle_s = 0.0 if starting else draw(st.sampled_from([0.0, 1.0, 30.0, 61.0, 500.0]))
        available = None if idle_s else draw(st.dictionaries(st.sampled_from(list(shape)), amounts, max_size=2))
        workers.append(WorkerState(f"w{index}", idle_s, shape, draining, available, starting))
    dem = ClusterDemand(
        pending=draw(st.lists(bundles, max_size=12)),
        head_free=draw(st.dictionaries(st.sampled_from(["CPU", "GPU"]), amounts, max_size=2)),
        worker_shape=shape,
    )
    return policy, workers, dem


@settings(max_examples=400, deadline=None, database=None)
@given(clusters())
def test_invariants(cluster: tuple[ScalingPolicy, list[WorkerState], ClusterDemand]):
    policy, workers, dem = cluster
    d: Decision = decide(policy, workers, dem)
    live = [w for w in workers if not w.draining]
    by_id = {w.worker_id: w for w in workers}

    assert d.reasons
    assert all(isinstance(r, str) and r for r in d.reasons)
    assert d.add >= 0
    assert not (d.add and d.remove), "never removes while adding"
    assert len(workers) + d.add <= policy.max_workers, "never exceeds max_workers"
    assert len(set(d.remove)) == len(d.remove)
    for worker_id in d.remove:
        worker = by_id[worker_id]
        assert not worker.draining
        assert not worker.starting
        assert worker.idle_s > policy.idle_timeout_s
    assert len(live) - len(d.remove) >= min(policy.min_workers, len(live)), "never removes below min_workers"
    if len(workers) + (policy.min_workers - len(live)) <= policy.max_workers:
        assert len(live) + d.add >= policy.min_workers, "fills up to min_workers when max allows"
    assert d.add <= max(policy.max_step_up, policy.min_workers - len(live))
    # A decision that changes nothing still explains itself.
    if not d.changes:
        assert d.reasons[-1].startswith("no change")
