"""Celery chords as OJS batches (ojs_celery.canvas) on a prefork worker: rpc:// and no result backend.

One worker for every case (it takes seconds to start); the chords' bodies append the header
results they were called with to a file, so a body run twice shows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from celery import chain, chord, group, signals
from celery.exceptions import ChordError
from frameworks import ojs_celery_app
from support import wait_until

from ojs_kombu import Job, batch

pytestmark = pytest.mark.broker


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_chords_on_rpc_and_without_a_backend_never_poll_and_call_the_body_once(
    celery_app, celery_subprocess_worker, client, amqp_url, prefix, tmp_path
):
    app = celery_app
    published: list[str] = []

    def on_publish(sender=None, **_):
        published.append(sender)

    def sig(name, *args, app=app):
        return app.signature(f"worker_app.{name}", args)

    signals.before_task_publish.connect(on_publish, weak=False)
    sums, failed, lost, bare_sums = (tmp_path / name for name in ("sums", "failed", "lost", "bare"))
    try:
        # The first report of an `add` in each pool process fails: that attempt is counted and runs again.
        with celery_subprocess_worker(concurrency=2, extra_env={"OJS_FAIL_FIRST_ADD_REPORT": "1"}):
            result = chord(group(sig("add", i, i) for i in range(20)), sig("tsum", str(sums))).apply_async()
            assert result.get(timeout=30) == 380

            # A header task that fails for good: the body does not run, its result is a ChordError naming the cause.
            failing = chord([sig("add", 1, 1), sig("explode", 3)], sig("tsum", str(failed))).apply_async()
            error = failing.get(timeout=30, propagate=False)
            assert failing.state == "FAILURE" and isinstance(error, ChordError), error
            assert "cannot handle 3" in str(error) and failing.parent.results[1].id in str(error)
            with pytest.raises(
                ValueError, match="cannot handle 3"
            ):  # get() raises the header's error first, as Celery does
                failing.get(timeout=5)

            # A header task whose pool process dies is retried (a counted attempt) and counted once.
            recovered = chord(
                [app.signature("worker_app.dies_once", immutable=True), sig("add", 2, 2)], sig("tsum", str(lost))
            )
            assert recovered.apply_async().get(timeout=30) == 5

            # Fire and forget: no result backend at all.
            with ojs_celery_app(amqp_url, prefix, backend=None) as bare:
                bare_result = chord(
                    [sig("add", 1, 2, app=bare), sig("add", 3, 4, app=bare)], sig("tsum", str(bare_sums), app=bare)
                ).apply_async()
            wait_until(lambda: lines(bare_sums), timeout=30, message="the body of the chord without a backend")

            # Each batch ends once its body (or on_failure) reported: nothing can run after that.
            for header in (result.parent.id, failing.parent.id, bare_result.parent.id):
                wait_until(
                    lambda header=header: client.workflow(header).state in ("completed", "failed"),
                    timeout=30,
                    message=f"workflow {header} ended",
                )
            assert client.workflow(result.parent.id).state == "completed"
    finally:
        signals.before_task_publish.disconnect(on_publish)

    # The body ran once, with the header's results in header order; never for the failed chord.
    assert lines(sums) == [[2 * i for i in range(20)]]
    assert lines(failed) == []
    assert lines(lost) == [[1, 4]]
    assert lines(bare_sums) == [[3, 7]]
    # No polling: the client published the header tasks and nothing else (no celery.chord_unlock,
    # no body: the fan-in's winner publishes it), and the worker received no chord_unlock.
    header_tasks = {"worker_app.add", "worker_app.explode", "worker_app.dies_once"}
    assert set(published) <= header_tasks and len(published) == 20 + 2 + 2 + 2, published
    log = (Path(os.environ.get("TMPDIR", "/tmp")) / f"celery-worker-{prefix}.log").read_text()
    assert "chord_unlock" not in log
    assert "could not be reported to its workflow" in log  # the injected failures happened (and were retried)
    assert log.count("worker_app.tsum[") and log.count("Task worker_app.tsum") == 3 * 2  # received + succeeded


def test_chord_shapes_errbacks_and_retried_members_on_rpc(celery_app, worker_factory, client):
    """What Celery users compose around a chord, on the in-thread worker: each shape gives Celery's result."""
    app = celery_app
    errors: list[tuple[str, str]] = []

    @app.task(name="canvas.add")
    def add(x, y):
        return x + y

    @app.task(name="canvas.tsum")
    def tsum(values, extra=0):
        return sum(values) + extra

    @app.task(name="canvas.ident")
    def ident(value):
        return value

    @app.task(name="canvas.boom")
    def boom(key):
        raise KeyError(key)

    @app.task(name="canvas.on_error")
    def on_error(request, exc, traceback):
        errors.append((request.id, repr(exc)))

    @app.task(name="canvas.flaky", bind=True, max_retries=2, default_retry_delay=0.1)
    def flaky(self, x):
        if self.request.retries == 0:
            raise self.retry(exc=RuntimeError("once"))
        return x * 10

    pair = [add.s(1, 1), add.s(2, 2)]
    with worker_factory(app, concurrency=4):
        assert chord(pair, tsum.s(100)).apply_async().get(timeout=20) == 106  # the body's own arguments follow
        assert chord(pair, chain(tsum.s(), ident.s())).apply_async().get(timeout=20) == 6
        assert chord(pair, group(tsum.s(), tsum.s(5))).apply_async().get(timeout=20) == [6, 11]
        assert chain(group(*pair), tsum.s(), ident.s()).apply_async().get(timeout=20) == 6
        assert chord([chain(add.s(1, 1), add.s(1)), add.s(2, 2)], tsum.s()).apply_async().get(timeout=20) == 7
        assert chord([chord(pair, tsum.s()), add.s(3, 3)], tsum.s()).apply_async().get(timeout=20) == 12
        assert chord(pair, tsum.s()).apply_async(task_id="not-a-uuid7").get(timeout=20) == 6
        # Members keep their retry policies: a retried member counts once, with its final result.
        assert chord([flaky.s(1), flaky.s(2), add.s(1, 2)], tsum.s()).apply_async().get(timeout=20) == 33
        # A failed member calls the body's errbacks with the ChordError; a failing body fails as any task.
        failing = chord([add.s(1, 1), boom.s("k")], tsum.s().on_error(on_error.s())).apply_async()
        assert isinstance(failing.get(timeout=20, propagate=False), ChordError)
        wait_until(lambda: errors, timeout=20, message="the body's errback")
        assert errors[0][0] == failing.id and "KeyError" in errors[0][1]
        assert isinstance(chord([add.s(1, 1)], boom.s()).apply_async().get(timeout=20, propagate=False), KeyError)
        # A failing chord inside a chord's header fails the enclosing chord too.
        nested = chord([chord([add.s(1, 1), boom.s("n")], tsum.s()), add.s(2, 2)], tsum.s()).apply_async()
        error = nested.get(timeout=20, propagate=False)
        assert isinstance(error, ChordError) and "raised ChordError" in str(error), error
        # A chain in the header whose first task fails: its last task never runs and still counts, failed.
        broken = chord([chain(boom.s("c"), add.s(1)), add.s(2, 2)], tsum.s()).apply_async()
        error = broken.get(timeout=20, propagate=False)
        assert isinstance(error, ChordError) and "raised KeyError" in str(error) and "'c'" in str(error), error
        # An OJS batch of Celery tasks (ojs_kombu.Client) advances on the Celery worker too.
        members = [Job.create("canvas.add", [x, x], queue="celery") for x in (1, 2)]
        workflow_id = client.enqueue_workflow(
            batch(members, on_complete=Job.create("canvas.ident", [0], queue="celery"))
        )
        wait_until(lambda: client.workflow(workflow_id).state == "completed", timeout=20, message="the OJS batch")
        info = client.workflow(workflow_id)
        assert (info.step(0).result, info.step(1).result, info.completed_count) == (2, 4, 2)
        # A revoked header task (dropped on delivery by the transport) fails the chord as Celery's Redis backend does.
        revoked = chord([add.s(1, 1).set(countdown=1), add.s(2, 2)], tsum.s()).apply_async()
        revoked.parent.results[0].revoke()
        error = revoked.get(timeout=20, propagate=False)
        assert isinstance(error, ChordError) and "TaskRevokedError('revoked')" in str(error), error


def test_ojs_chords_false_keeps_the_backends_own_chords(amqp_url, prefix):
    with ojs_celery_app(amqp_url, prefix, ojs_chords=False) as app:
        with pytest.raises(NotImplementedError):  # Celery's rpc:// backend refuses chords
            chord([app.signature("canvas.add", (1, 1))], app.signature("canvas.tsum")).apply_async()
