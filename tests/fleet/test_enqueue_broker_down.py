"""Commands sent while the broker refuses (Redis restarting): the call that made them succeeds, and they
wait queued for the beat's resend (`commands_resend_stuck`), which sends them once the broker is back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery import current_app

from fleet import services
from fleet.models import CommandStatus
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db


@contextmanager
def broker_at(url: str) -> Iterator[None]:
    """This process's Celery publishes to `url` (its connection and producer pools made anew), then back."""
    app = current_app
    before = app.conf.broker_url

    def fresh_pools() -> None:
        if app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None

    app.conf.broker_url = url
    fresh_pools()
    try:
        yield
    finally:
        app.conf.broker_url = before
        fresh_pools()


def test_commands_sent_while_the_broker_refuses_are_kept_queued_and_the_call_succeeds(
    cluster, register_node, owner, django_capture_on_commit_callbacks, caplog
):
    a = register_node(cluster, "a")
    register_node(cluster, "b")
    caplog.set_level(logging.WARNING, logger="fleet.enqueue")
    with broker_at(f"redis://127.0.0.1:{free_port()}/0"):  # nothing listens there
        with django_capture_on_commit_callbacks(execute=True):
            (one,) = services.command_dispatch(
                actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "a/b"}, node=a
            )
        with django_capture_on_commit_callbacks(execute=True):
            fanned = services.command_dispatch(
                actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "a/b"}
            )
    assert len(fanned) == 2
    for command in (one, *fanned):
        command.refresh_from_db()
        assert command.status == CommandStatus.QUEUED
    refused = [r.getMessage() for r in caplog.records if "the beat's resend will send it" in r.getMessage()]
    assert len(refused) == 2, caplog.text  # one dispatch task, one batch task
    assert str(one.pk) in refused[0]
