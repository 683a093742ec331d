"""Usage of proxied requests: tokens read from responses, noted in memory, written with one upsert."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.usage import flush_notes, meter
from fleet.usage.models import UsageRollup
from kernel.asgi_scope import API_KEY_ID_SCOPE_KEY

pytestmark = pytest.mark.django_db

JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _chunk(content: str, usage: object = "absent") -> bytes:
    body: dict = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}
    if usage != "absent":
        body["usage"] = usage
    return _event(body)


def _usage(kind, chunks, status=200) -> meter.RequestUsage:
    usage = meter.RequestUsage(meter.Subject(uuid.uuid4(), uuid.uuid4()), None)
    usage.head(status, kind)
    for chunk in chunks:
        usage.feed(chunk)
    return usage


def test_a_json_answer_reports_its_usage():
    usage = {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}
    body = json.dumps({"choices": [{"text": '"usage": {"prompt_tokens": 99}'}], "usage": usage}).encode()
    assert _usage(JSON, [body[:10], body[10:40], body[40:]]).tokens() == (7, 12)  # split anywhere


def test_a_json_answer_without_usage_or_not_json_counts_no_tokens():
    assert _usage(JSON, [b'{"data": [{"id": "m"}]}']).tokens() == (0, 0)
    text = [(b"content-type", b"text/plain")]
    assert _usage(text, [b'"usage": {"prompt_tokens": 1, "completion_tokens": 2}']).tokens() == (0, 0)


def test_a_stream_takes_the_usage_of_its_final_chunk():
    chunks = [_chunk(w, usage=None) for w in ("a", " b", " c")]  # vLLM: "usage": null on content chunks
    final = _event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    done = b"data: [DONE]\n\n"
    assert _usage(SSE, [*chunks, final, done]).tokens() == (5, 3)
    assert _usage(SSE, [*chunks, final + done]).tokens() == (5, 3)  # joined in one read
    assert _usage(SSE, [*chunks, final[:30], final[30:], done]).tokens() == (5, 3)  # cut across reads


def test_a_stream_without_usage_counts_its_content_events():
    chunks = [_chunk(w) for w in ("a", " b", " c", " d")]
    assert _usage(SSE, [*chunks[:2], chunks[2] + chunks[3], b"data: [DONE]\n\n"]).tokens() == (0, 4)
    assert _usage(SSE, [_chunk(w, usage=None) for w in "xyz"]).tokens() == (0, 3)  # nulls: counted too


def _rows(**filters):
    return list(UsageRollup.objects.filter(**filters).order_by("granularity", "api_key_id"))


def test_finished_requests_are_noted_and_written_with_one_upsert(workspace, settings):
    settings.USAGE_FLUSH_S = 3600
    endpoint = uuid.uuid4()
    subject = meter.Subject(workspace.pk, endpoint)
    at = datetime(2026, 12, 5, 10, 7, 30, tzinfo=UTC).timestamp()

    async def main():
        for i in range(200):
            key = 42 if i % 2 else None
            seconds = 0.01 * (i % 4)
            error = i % 10 == 0
            meter.observe(subject, key, error=error, prompt_tokens=3, completion_tokens=5, seconds=seconds, now=at)

    asyncio.run(main())
    assert not UsageRollup.objects.exists()  # nothing written on the request path
    with CaptureQueriesContext(connection) as queries:
        assert meter.flush() == 2  # two buckets: without a key and with key 42
    assert len(queries) == 1  # one statement for all of them
    minute = _rows(granularity="minute")
    assert [(r.api_key_id, r.requests, r.errors, r.prompt_tokens, r.completion_tokens) for r in minute] == [
        (42, 100, 0, 300, 500),
        (None, 100, 20, 300, 500),
    ]
    assert minute[0].bucket_start == datetime(2026, 12, 5, 10, 7, tzinfo=UTC)
    assert minute[0].latency_ms_max == pytest.approx(30.0)
    assert sum(r.latency_ms_sum for r in minute) == pytest.approx(100 * (0 + 10 + 20 + 30) / 2)
    hour = _rows(granularity="hour")
    assert [(r.bucket_start, r.requests) for r in hour] == [(datetime(2026, 12, 5, 10, tzinfo=UTC), 100)] * 2

    # a later flush adds to the same rows
    meter.observe(subject, None, error=False, prompt_tokens=1, completion_tokens=1, seconds=0.5, now=at + 20)
    rows = {r.granularity: r for r in _rows(api_key_id=None)}
    assert (rows["minute"].requests, rows["hour"].requests, rows["hour"].prompt_tokens) == (101, 101, 301)
    assert rows["minute"].latency_ms_max == pytest.approx(500.0)


def test_what_is_left_is_written_at_exit_and_a_failed_write_keeps_it(workspace, settings, monkeypatch):
    settings.USAGE_FLUSH_S = 3600
    subject = meter.Subject(workspace.pk, uuid.uuid4())

    async def main():
        meter.observe(subject, None, error=False, prompt_tokens=2, completion_tokens=9, seconds=0.1)

    asyncio.run(main())
    from django.db import DatabaseError

    from fleet.usage import services

    def refuse(**_):
        raise DatabaseError("down")

    monkeypatch.setattr(services, "usage_add", refuse)
    assert meter.flush() == 0
    monkeypatch.undo()
    assert not UsageRollup.objects.exists()
    meter._flush_at_exit()  # what the process's exit runs
    assert [(r.requests, r.completion_tokens) for r in _rows()] == [(1, 9), (1, 9)]


@pytest.mark.django_db(transaction=True)  # the flush writes on a thread of its own
def test_a_flush_is_scheduled_after_the_first_request_and_runs_on_a_thread(workspace, settings):
    settings.USAGE_FLUSH_S = 0.05
    subject = meter.Subject(workspace.pk, uuid.uuid4())

    async def main():
        meter.observe(subject, 7, error=False, prompt_tokens=1, completion_tokens=2, seconds=0.1)
        meter.observe(subject, 7, error=True, prompt_tokens=1, completion_tokens=0, seconds=0.1)
        await asyncio.sleep(0.3)  # the flush is due after 0.05 s; asyncio.run then waits for its thread

    asyncio.run(main())
    assert [(r.requests, r.errors, r.completion_tokens) for r in _rows()] == [(2, 1, 2), (2, 1, 2)]


def test_callbacks_learn_each_requests_tokens(workspace, settings):
    settings.USAGE_FLUSH_S = 3600
    seen = []
    callback = meter.on_request_metered(lambda *args: seen.append(args))
    subject = meter.Subject(workspace.pk, uuid.uuid4())
    try:
        usage = meter.start(subject, {"type": "http", API_KEY_ID_SCOPE_KEY: 5})
        usage.head(200, JSON)
        usage.feed(b'{"usage": {"prompt_tokens": 4, "completion_tokens": 6}}')

        async def main():
            usage.finish(complete=True)

        asyncio.run(main())
    finally:
        meter._callbacks.remove(callback)
    assert seen == [(workspace.pk, subject.endpoint_id, 5, 4, 6, None)]


def test_metering_off_meters_nothing(settings):
    settings.USAGE_METERING = False
    assert meter.start(meter.Subject(uuid.uuid4(), uuid.uuid4()), {}) is None
    settings.USAGE_METERING = True
    assert meter.start(None, {}) is None  # a target that names no endpoint (a Ray Dashboard)


def test_two_minutes_of_one_hour_in_one_flush_are_written_and_the_next_flush_adds_to_them(workspace, settings):
    """One flush holding minutes 10:12 and 10:13 gives two additions to the 10:00 hour row: they
    are added up before the upsert (PostgreSQL refuses to touch a row twice in one statement)."""
    settings.USAGE_FLUSH_S = 3600
    endpoint = uuid.uuid4()
    subject = meter.Subject(workspace.pk, endpoint)
    before = datetime(2026, 12, 5, 10, 12, 58, tzinfo=UTC).timestamp()
    after = datetime(2026, 12, 5, 10, 13, 0, tzinfo=UTC).timestamp()
    # the pending data as the proxy leaves it, written directly: two minutes of one hour, key and no key
    for now, key, prompt, completion, ms in (
        (before, None, 10, 38, 20.0),
        (after, None, 8, 16, 50.0),
        (after, 7, 1, 2, 5.0),
    ):
        meter._pending[(int(now) // 60 * 60, workspace.pk, endpoint, key)] = [1, 0, prompt, completion, ms, ms, 0]
    failures = _sample("cleverthis_usage_flush_failures_total")
    assert meter.flush() == 3
    assert not meter._pending
    minutes = [
        (r.bucket_start.minute, r.api_key_id, r.requests, r.prompt_tokens, r.completion_tokens)
        for r in UsageRollup.objects.filter(granularity="minute").order_by("bucket_start", "api_key_id")
    ]
    assert minutes == [(12, None, 1, 10, 38), (13, 7, 1, 1, 2), (13, None, 1, 8, 16)]
    hour = _rows(granularity="hour", api_key_id=None)
    assert [(r.bucket_start, r.requests, r.prompt_tokens, r.completion_tokens) for r in hour] == [
        (datetime(2026, 12, 5, 10, tzinfo=UTC), 2, 18, 54)
    ]
    assert hour[0].latency_ms_sum == pytest.approx(70.0)
    assert hour[0].latency_ms_max == pytest.approx(50.0)

    # the next flush, again straddling the minute, adds to the same rows
    async def straddling():  # (on a loop, as in the proxy: noted, not written)
        meter.observe(subject, None, error=True, prompt_tokens=3, completion_tokens=4, seconds=0.09, now=before)
        meter.observe(subject, None, error=False, prompt_tokens=5, completion_tokens=6, seconds=0.01, now=after)

    asyncio.run(straddling())
    assert meter.flush() == 2
    hour = _rows(granularity="hour", api_key_id=None)
    assert [(r.requests, r.errors, r.prompt_tokens, r.completion_tokens) for r in hour] == [(4, 1, 26, 64)]
    assert hour[0].latency_ms_max == pytest.approx(90.0)
    assert _sample("cleverthis_usage_flush_failures_total") == failures  # nothing failed
    assert meter.flush() == 0  # nothing left


def _sample(name: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name) or 0.0


def test_a_failed_flush_is_counted_and_shown_on_the_usage_page_until_one_succeeds(
    client, owner, workspace, settings, monkeypatch
):
    settings.USAGE_FLUSH_S = 3600
    subject = meter.Subject(workspace.pk, uuid.uuid4())

    async def main():
        meter.observe(subject, None, error=False, prompt_tokens=2, completion_tokens=9, seconds=0.1)

    asyncio.run(main())
    from django.db import ProgrammingError

    from fleet.usage import services

    def refuse(**_):
        raise ProgrammingError("ON CONFLICT DO UPDATE command cannot affect row a second time\nHINT: ...")

    client.force_login(owner)
    assert b"data-usage-flush-failed" not in client.get("/usage/").content
    failures = _sample("cleverthis_usage_flush_failures_total")
    monkeypatch.setattr(services, "usage_add", refuse)
    assert meter.flush() == 0
    assert _sample("cleverthis_usage_flush_failures_total") == failures + 1
    page = client.get("/usage/").content.decode()
    assert "data-usage-flush-failed" in page
    assert "cannot affect row a second time" in page
    assert [n["buckets"] for n in flush_notes.flush_failures()] == [1]
    monkeypatch.undo()
    assert meter.flush() == 1  # the kept counts are written: the banner goes
    assert flush_notes.flush_failures() == []
    assert b"data-usage-flush-failed" not in client.get("/usage/").content
    assert [(r.requests, r.completion_tokens) for r in _rows()] == [(1, 9), (1, 9)]


@pytest.mark.django_db(transaction=True)  # the flush writes on a thread of its own
def test_a_failed_timed_flush_tries_again_without_new_requests(workspace, settings, monkeypatch):
    settings.USAGE_FLUSH_S = 0.05
    subject = meter.Subject(workspace.pk, uuid.uuid4())
    from django.db import OperationalError

    from fleet.usage import services

    real = services.usage_add
    calls = []

    def down_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("the database is restarting")
        return real(**kwargs)

    monkeypatch.setattr(services, "usage_add", down_once)

    async def main():
        meter.observe(subject, None, error=False, prompt_tokens=3, completion_tokens=4, seconds=0.1)
        for _ in range(100):  # no other request comes: the retry is the meter's own
            await asyncio.sleep(0.05)
            if len(calls) >= 2 and not meter._pending:
                break

    asyncio.run(main())
    assert len(calls) >= 2
    assert [(r.requests, r.prompt_tokens, r.completion_tokens) for r in _rows()] == [(1, 3, 4), (1, 3, 4)]
    assert flush_notes.flush_failures() == []  # the banner went with the successful write
