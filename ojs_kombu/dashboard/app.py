"""The dashboard's Starlette application: its pages and actions over one :class:`~ojs_kombu.client.Client`.

Every endpoint is synchronous (Starlette runs it in its thread pool), since the client is.
Errors of the control plane (:class:`~ojs_kombu.errors.OjsError`) become a page with the
error's type and message, with the broker password removed; the broker URL itself is never shown.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ojs_kombu.amqp.management import ManagementClient
from ojs_kombu.amqp.urls import redact
from ojs_kombu.client import Client
from ojs_kombu.dashboard.cronwatch import CronWatch
from ojs_kombu.dashboard.history import DepthHistory
from ojs_kombu.dashboard.holds import LOCKS_SHOWN, holds
from ojs_kombu.dashboard.overview import Snapshot, snapshot
from ojs_kombu.dashboard.render import describe_error, error_runs, queue_state, show, when
from ojs_kombu.dashboard.replays import Replays, predates
from ojs_kombu.dashboard.security import CSRF_FIELD, CsrfError, Guard, csrf_token, posted_form
from ojs_kombu.dashboard.stats import CHARTED, LABELS, EventHistory, Series
from ojs_kombu.dashboard.story import timeline
from ojs_kombu.dashboard.svg import bars, sparkline
from ojs_kombu.dashboard.wfgraph import STATE_LABELS, graph, step_states
from ojs_kombu.dashboard.workflows import Workflows
from ojs_kombu.errors import NotFoundError, OjsError, ValidationError
from ojs_kombu.model.ids import UUID_RE
from ojs_kombu.model.info import JobInfo
from ojs_kombu.model.job import Job
from ojs_kombu.model.timefmt import utcnow
from ojs_kombu.model.workflow import node_at
from ojs_kombu.model.workflow_info import StepInfo, WorkflowInfo
from ojs_kombu.runtime.cron import RegisteredCron
from ojs_kombu.runtime.deadletter import DeadLetterEntry, DeadLetterFilter
from ojs_kombu.wire.events import JobEventRecord

_TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
_TEMPLATES.env.globals["sparkline"] = sparkline
_TEMPLATES.env.globals["quote"] = lambda s: quote(str(s), safe="")
_TEMPLATES.env.globals.update(
    show=show, when=when, describe_error=describe_error, error_runs=error_runs, queue_state=queue_state
)
_STATIC = Path(__file__).parent / "static"


def _chart(series: Series, title: str) -> Any:
    stacks = [(event.replace("-", ""), LABELS[event], series.counts[event]) for event in CHARTED]
    return bars(series.starts, stacks, title=title)


_TEMPLATES.env.globals.update(chart=_chart, charted=CHARTED, labels=LABELS)

#: INFO states in which a cancel still does something: running, or waiting for its next attempt
#: (a job no worker knows may be waiting or scheduled: cancellable too).
CANCELLABLE_STATES = frozenset({"active", "retryable"})
#: What the Crons page does to a cron job.
CRON_ACTIONS = ("enable", "disable")
#: Seconds an enable / disable waits for the cron stream followed to show it.
CRON_READ_BACK = 5.0

#: Default seconds between the live updates of an open page.
DEFAULT_REFRESH = 5.0
#: The request header of a live update (``static/live.js``).
LIVE_HEADER = "x-ojs-live"
#: Seconds a stream read of the dashboard's history may take to catch up (the first one reads the window).
EVENTS_READ_TIMEOUT = 300.0
#: Queues whose workers are asked INFO when a job is looked up without its queue.
INFO_SEARCH_QUEUES = 5


class Dashboard:
    """The state behind the pages: the client, the management API, the depth history, the mode.

    Parameters:
        client: the control plane client (its prefix is the dashboard's).
        management: the management API for queue discovery and rates, or None.
        read_only: hide the actions (the :class:`~ojs_kombu.dashboard.security.Guard` refuses POSTs).
        sample_every: seconds between the background depth samples (0: only on page views).
        refresh: seconds between the live updates of an open page (0: none, the pages are static).
    """

    def __init__(
        self,
        client: Client,
        management: ManagementClient | None,
        *,
        read_only: bool = False,
        sample_every: float = 5.0,
        refresh: float = DEFAULT_REFRESH,
    ) -> None:
        self.client = client
        self.management = management
        self.read_only = read_only
        self.refresh = refresh
        self.history = DepthHistory()
        self.replays = Replays()
        self.workflows = Workflows(client, management)
        self.events = EventHistory(lambda since, limit: client.events(since, limit=limit, timeout=EVENTS_READ_TIMEOUT))
        self._sample_every = sample_every
        self._stop = threading.Event()
        self._cron_lock = threading.Lock()
        self._cron_watch: CronWatch | None = None
        password = urlsplit(client.url.split(";")[0].strip()).password
        self._secrets = [s for s in {password, unquote(password) if password else None} if s]

    def redact(self, text: str) -> str:
        """``text`` without the broker password (a broker error may quote the URL): see
        :func:`ojs_kombu.amqp.urls.redact`."""
        return redact(text, self._secrets)

    def snapshot(self, only: tuple[str, ...] = (), request: Request | None = None) -> Snapshot:
        """A :func:`~ojs_kombu.dashboard.overview.snapshot`, recorded in the depth history, unless
        ``request`` is a live update while the sampler runs (the sparklines' time span must not
        depend on how many pages are open)."""
        shot = snapshot(self.client, self.management, only)
        if not (self.sampling and request is not None and request.headers.get(LIVE_HEADER)):
            self.history.record(shot)
        return shot

    @property
    def sampling(self) -> bool:
        """Whether the background sampler records the depths (see :meth:`lifespan`)."""
        return self._sample_every > 0 and self.management is not None

    def _sample(self) -> None:
        while not self._stop.wait(self._sample_every):
            try:
                self.snapshot()
            except OjsError:
                pass  # the next page view shows the error; the sampler keeps going

    def _follow(self) -> None:
        """Read the events stream's window, then what comes (:class:`~ojs_kombu.dashboard.stats.EventHistory`)."""
        every = self._sample_every if self._sample_every > 0 else DEFAULT_REFRESH
        while not self._stop.is_set():
            try:
                self.events.refresh()
            except OjsError:
                pass  # events.error says it on the pages; the next round tries again
            self._stop.wait(every)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Run the depth sampler thread and the events reader while the application serves."""
        threads = [threading.Thread(target=self._follow, name="ojs-dashboard-events", daemon=True)]
        if self.sampling:
            threads.append(threading.Thread(target=self._sample, name="ojs-dashboard-sampler", daemon=True))
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=5)
            if self._cron_watch is not None:
                self._cron_watch.stop()

    # -- rendering -------------------------------------------------------------------------

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        """Render ``template`` with the mode, the live update period (none for the answer to a POST,
        e.g. a confirmation: it cannot be fetched again) and the CSRF token."""
        context.update(
            request=request, actions=not self.read_only, csrf=csrf_token(request), csrf_field=CSRF_FIELD,
            events=self.events, events_error=self.redact(self.events.error),
            refresh=f"{self.refresh:g}" if self.refresh > 0 and request.method == "GET" else "",
        )  # fmt: skip
        return _TEMPLATES.TemplateResponse(request, template, context, status_code=status_code)

    def guarded(self, endpoint: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """``endpoint``, with an :class:`OjsError` rendered as an error page (400 / 404 / 502)."""

        def run(request: Request) -> Response:
            try:
                return endpoint(request)
            except OjsError as exc:
                code = 404 if isinstance(exc, NotFoundError) else 400 if isinstance(exc, ValidationError) else 502
                return self.page(request, "error.html", code, error=type(exc).__name__, message=self.redact(str(exc)))

        return run

    # -- pages -----------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        """GET /: every OJS queue with its depth, sparkline, rates; the totals."""
        only = tuple(request.query_params.getlist("queue"))
        shot = self.snapshot(only, request)
        week = request.query_params.get("span") == "week"
        workers = self.client.workers()
        busy, capacity = sum(len(w.active) for w in workers), sum(w.concurrency for w in workers)
        return self.page(
            request, "overview.html", shot=shot, totals=shot.totals()["totals"], history=self.history,
            note=self.redact(shot.note), week=week, series=self._series(None, week),
            timings={q.queue: self.events.timings(q.queue) for q in shot.queues}, all_timings=self.events.timings(),
            workers=workers, busy=busy, capacity=capacity,
        )  # fmt: skip

    def _series(self, queue: str | None, week: bool) -> Series:
        return self.events.series(queue, step=3600, buckets=168) if week else self.events.series(queue)

    def queue(self, request: Request) -> Response:
        """GET /queues/{queue}: its counts, retry queues and first dead letters."""
        name = request.path_params["queue"]
        shot = self.snapshot((name,), request)
        retry = []
        if self.management is not None:
            head = self.client.names.job_queue(f"retry.{name}.")
            retry = sorted(q["name"] for q in self.management.queues(head))
        counts = self.client.queue_counts(retry)
        letters = self.client.dead_letters(name, limit=10) if shot.queues[0].exists else []
        week = request.query_params.get("span") == "week"
        return self.page(
            request, "queue.html", queue=name, row=shot.queues[0], history=self.history.of(name),
            retry=[(q, counts[q]) for q in retry], letters=letters, week=week, series=self._series(name, week),
            timing=self.events.timings(name),
        )  # fmt: skip

    def _filter(self, params: Any) -> DeadLetterFilter:
        types = [t for t in params.getlist("type") if t]
        ids = [i for i in params.getlist("id") if i]
        return DeadLetterFilter.of(types=types or None, error=params.get("error") or None, ids=ids or None)

    def dead_letters(self, request: Request) -> Response:
        """GET /queues/{queue}/dead: the decoded dead letters, filtered by ``type`` and ``error``."""
        name = request.path_params["queue"]
        select = self._filter(request.query_params)
        text = request.query_params.get("limit") or "100"
        if not text.isdigit():
            raise ValidationError(f"limit must be a whole number, got {text!r}", field="limit")
        limit = int(text)
        letters = self.client.dead_letters(name, limit=limit, select=select)
        return self.page(
            request, "dead.html", queue=name, letters=letters, type=request.query_params.get("type", ""),
            error=request.query_params.get("error", ""),
        )  # fmt: skip

    async def confirm(self, request: Request) -> Response:
        """POST /queues/{queue}/dead/confirm: the confirmation step of a replay or purge."""
        form = await posted_form(request)
        action = form.get("action")
        if action not in ("replay", "purge"):
            return Response("action must be replay or purge", status_code=400)
        ids = [str(i) for i in form.getlist("id")]
        return self.page(
            request, "confirm.html", queue=request.path_params["queue"], action=action, ids=ids,
            type=form.get("type", ""), error=form.get("error", ""),
        )  # fmt: skip

    async def act_on_dead(self, request: Request) -> Response:
        """POST /queues/{queue}/dead/{action}: replay or purge the confirmed letters."""
        form = await posted_form(request)
        name, action = request.path_params["queue"], request.path_params["action"]
        if action not in ("replay", "purge"):
            return Response("action must be replay or purge", status_code=404)
        if form.get("confirmed") != "yes":
            return Response("not confirmed", status_code=400)
        select = self._filter(form)
        if action == "replay":
            started = utcnow()
            replayed = self.client.replay_dead_letters(name, select=select)
            self.replays.record(replayed, started)
            done = len(replayed)
        else:
            done = self.client.purge_dead_letters(name, select=select)
        return RedirectResponse(f"/queues/{quote(name, safe='')}/dead?done={action}:{done}", status_code=303)

    def workers(self, request: Request) -> Response:
        """GET /workers: each worker, the jobs it runs and since when; pause / resume per queue."""
        workers = self.client.workers()
        queues = sorted({q for w in workers for q in w.queues})
        paused = self.client.paused_queues(queues) if queues else {}
        return self.page(request, "workers.html", workers=workers, paused=paused)

    async def pause(self, request: Request) -> Response:
        """POST /queues/{queue}/pause and /resume."""
        await posted_form(request)
        name, action = request.path_params["queue"], request.path_params["action"]
        if action not in ("pause", "resume"):
            return Response("action must be pause or resume", status_code=404)
        (self.client.pause if action == "pause" else self.client.resume)(name)
        return RedirectResponse("/workers", status_code=303)

    def job(self, request: Request) -> Response:
        """GET /jobs?id=[&queue=]: the job's story (:func:`~ojs_kombu.dashboard.story.timeline`) and its INFO.

        The id (or a Dramatiq / Celery id) is searched in the events read, the dead letters (of ``queue``,
        else of every queue holding some) and INFO (of ``queue``, else of the first queues that have
        workers); cancel is offered while it can still act; an outcome from before a replay made here
        said so (:mod:`~ojs_kombu.dashboard.replays`)."""
        job_id = request.query_params.get("id", "").strip().lower()
        queue = request.query_params.get("queue", "").strip()
        info, letter, looked = None, None, bool(job_id)
        story: list[JobEventRecord] = []
        if job_id:
            info, letter, story, queue = self._find(job_id, queue)
        found_id = info.job_id if info is not None else letter.letter_id if letter is not None else job_id
        replayed_at = self.replays.last(found_id) if job_id else None
        before_replay = predates(info, replayed_at)  # then the replayed job waits: a cancel drops it
        steps = timeline(story, letter, info, replayed_at) if job_id else []
        return self.page(
            request, "job.html", job_id=job_id, found_id=found_id, queue=queue, info=info, looked=looked,
            cancellable=bool(queue) and (info is None or info.state in CANCELLABLE_STATES or before_replay),
            replayed_at=replayed_at, before_replay=before_replay, steps=steps, letter=letter,
        )  # fmt: skip

    def _find(
        self, job_id: str, queue: str
    ) -> tuple[JobInfo | None, DeadLetterEntry | None, list[JobEventRecord], str]:
        """INFO, the dead letter and the events of ``job_id``, and its queue once known."""
        story = self.events.story(job_id)
        queue = queue or (story[-1].queue if story else "")
        info = self.client.info(job_id, queue=queue, timeout=1.0) if queue else None
        shot = None
        if not queue:
            shot = self.snapshot((), request=None)
            for row in [r for r in shot.queues if r.consumers][:INFO_SEARCH_QUEUES]:
                info = self.client.info(job_id, queue=row.queue, timeout=1.0)
                if info is not None:
                    queue = row.queue
                    break
        letter = None
        select = DeadLetterFilter.of(ids=[job_id] + ([info.job_id] if info is not None else []))
        searched = [queue] if queue else [r.queue for r in (shot.queues if shot else []) if r.dead != 0 and r.exists]
        for name in searched:
            try:
                found = self.client.dead_letters(name, limit=1, select=select)
            except NotFoundError:
                continue
            if found:
                letter, queue = found[0], name
                break
        real_id = info.job_id if info is not None else letter.letter_id if letter is not None else job_id
        if real_id != job_id:
            story = self.events.story(real_id)
        return info, letter, story, queue

    def crons(self, request: Request) -> Response:
        """GET /crons: the registered cron jobs (next and last run, enabled) and the scheduler elected last."""
        crons, leader = self.cron_watch().crons()
        return self.page(
            request, "crons.html", crons=crons, leader=leader, done=request.query_params.get("done", ""),
            cron_error=self.redact(self._cron_watch.error) if self._cron_watch else "",
        )  # fmt: skip

    def cron_watch(self) -> CronWatch:
        """The cron stream followed (:mod:`~ojs_kombu.dashboard.cronwatch`), started on first use."""
        with self._cron_lock:
            if self._cron_watch is None:
                self._cron_watch = CronWatch(self.client.url, self.client.names).start()
            return self._cron_watch

    def _cron(self, name: str) -> RegisteredCron:
        found = [c for c in self.cron_watch().crons()[0] if c.name == name]
        if not found:
            raise NotFoundError(f"no cron job is named {name!r}", reply_code=404)
        return found[0]

    async def confirm_cron(self, request: Request) -> Response:
        """POST /crons/{name}/confirm: the confirmation step of an enable or disable."""
        form = await posted_form(request)
        action = form.get("action")
        if action not in CRON_ACTIONS:
            return Response("action must be enable or disable", status_code=400)
        cron = self._cron(request.path_params["name"])
        return self.page(request, "confirm_cron.html", cron=cron, action=action)

    async def act_on_cron(self, request: Request) -> Response:
        """POST /crons/{name}/{action}: enable or disable the confirmed cron job (registered again with
        ``enabled`` changed: its runs so far are kept)."""
        form = await posted_form(request)
        name, action = request.path_params["name"], request.path_params["action"]
        if action not in CRON_ACTIONS:
            return Response("action must be enable or disable", status_code=404)
        if form.get("confirmed") != "yes":
            return Response("not confirmed", status_code=400)
        cron = self._cron(name)
        self.client.register_cron(
            cron.name, cron.cron, cron.type, cron.args, queue=cron.queue, timezone=cron.timezone,
            overlap_policy=cron.overlap_policy, enabled=action == "enable", description=cron.description,
            options={k: v for k, v in cron.options.items() if k != "queue"},
        )  # fmt: skip
        wanted = action == "enable"  # the page the redirect shows must say it: wait for the stream to tell
        self.cron_watch().wait_for(lambda e: name in e and e[name].cron.enabled is wanted, CRON_READ_BACK)
        return RedirectResponse(f"/crons?done={action}:{quote(name, safe='')}", status_code=303)

    def limits(self, request: Request) -> Response:
        """GET /limits: the concurrency limits' permits and the unique locks held (:mod:`~ojs_kombu.dashboard.holds`)."""
        found = holds(self.client, self.management)
        return self.page(request, "limits.html", holds=found, note=self.redact(found.note), shown=LOCKS_SHOWN)

    def workflows_page(self, request: Request) -> Response:
        """GET /workflows: the newest workflows (:mod:`~ojs_kombu.dashboard.workflows`); ``?id=`` opens one."""
        wanted = request.query_params.get("id", "").strip().lower()
        if wanted:
            return RedirectResponse(f"/workflows/{quote(wanted, safe='')}", status_code=303)
        listing = self.workflows.recent()
        return self.page(request, "workflows.html", listing=listing, note=self.redact(listing.note))

    def workflow(self, request: Request) -> Response:
        """GET /workflows/{id}: the workflow's graph (:mod:`~ojs_kombu.dashboard.wfgraph`), its steps and result."""
        info = self.workflows.get(_workflow_id(request))
        ended = info.state in ("completed", "failed", "cancelled")
        running = set() if ended else {job.job_id for w in self.client.workers() for job in w.active}
        states = step_states(info, running)
        queues = {s.path: q for s in info.steps if (q := _queue_of(info, s.path))}

        def link(step: StepInfo, job: Job) -> str:
            return f"/jobs?id={quote(step.job_id, safe='')}&queue={quote(job.queue, safe='')}"

        return self.page(
            request, "workflow.html", info=info, states=states, labels=STATE_LABELS, queues=queues,
            svg=graph(info, states, link=link),
        )  # fmt: skip

    async def confirm_workflow_cancel(self, request: Request) -> Response:
        """POST /workflows/{id}/confirm: the confirmation step of a workflow's cancel."""
        await posted_form(request)
        return self.page(request, "confirm_workflow.html", workflow_id=_workflow_id(request))

    async def cancel_workflow(self, request: Request) -> Response:
        """POST /workflows/{id}/cancel: cancel the confirmed workflow (``Client.cancel_workflow``)."""
        form = await posted_form(request)
        if form.get("confirmed") != "yes":
            return Response("not confirmed", status_code=400)
        workflow_id = _workflow_id(request)
        self.client.cancel_workflow(workflow_id)
        return RedirectResponse(f"/workflows/{workflow_id}?cancelled=1", status_code=303)

    async def cancel(self, request: Request) -> Response:
        """POST /jobs/cancel: cancel the job ``id`` of ``queue``."""
        form = await posted_form(request)
        job_id, queue = str(form.get("id", "")), str(form.get("queue", ""))
        self.client.cancel(job_id, queue=queue)
        return RedirectResponse(f"/jobs?id={quote(job_id)}&queue={quote(queue)}&cancelled=1", status_code=303)


def _workflow_id(request: Request) -> str:
    """The workflow id of the URL, checked (a lowercase UUID)."""
    workflow_id = str(request.path_params["id"])
    if not UUID_RE.fullmatch(workflow_id):
        raise ValidationError(f"a workflow id is a lowercase UUID, got {workflow_id!r}", field="id")
    return workflow_id


def _queue_of(info: WorkflowInfo, path: tuple[int | str, ...]) -> str:
    """The queue of the job at ``path`` of ``info``'s definition ("" when unknown)."""
    if info.definition is None:
        return ""
    job = node_at(info.definition, path)
    return job.queue if isinstance(job, Job) else ""


def _async_guarded(dash: Dashboard, endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    async def run(request: Request) -> Response:
        try:
            response: Response = await endpoint(request)
            return response
        except CsrfError as exc:
            return Response(str(exc), status_code=403, media_type="text/plain")
        except OjsError as exc:
            return dash.page(request, "error.html", 400, error=type(exc).__name__, message=dash.redact(str(exc)))

    return run


def create_app(
    client: Client,
    management: ManagementClient | None = None,
    *,
    read_only: bool = False,
    token: str | None = None,
    sample_every: float = 5.0,
    refresh: float = DEFAULT_REFRESH,
) -> Starlette:
    """The dashboard application.

    Parameters:
        client: the control plane client; the caller closes it.
        management: the management API (queue discovery, retry queues, rates), or None.
        read_only: no actions: buttons hidden, every POST refused with 403.
        token: required on every request (Bearer header, or ``?token=`` setting a cookie), or None.
        sample_every: seconds between depth samples for the sparklines (0: page views only).
        refresh: seconds between the live updates of an open page (fetch polling by
            ``static/live.js``, served by the package), 0 for none.

    Returns:
        The Starlette application, to serve with uvicorn.

    Raises:
        ValidationError: ``refresh`` is not a number >= 0.
    """
    if isinstance(refresh, bool) or not isinstance(refresh, int | float) or not refresh >= 0:
        raise ValidationError(f"refresh must be a number of seconds >= 0, got {refresh!r}", field="refresh")
    dash = Dashboard(client, management, read_only=read_only, sample_every=sample_every, refresh=refresh)
    g = dash.guarded

    def ag(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
        return _async_guarded(dash, endpoint)

    routes = [
        Route("/", g(dash.overview)),
        Route("/queues/{queue}", g(dash.queue)),
        Route("/queues/{queue}/dead", g(dash.dead_letters)),
        Route("/queues/{queue}/dead/confirm", ag(dash.confirm), methods=["POST"]),
        Route("/queues/{queue}/dead/{action:str}", ag(dash.act_on_dead), methods=["POST"]),
        Route("/queues/{queue}/{action:str}", ag(dash.pause), methods=["POST"]),
        Route("/workers", g(dash.workers)),
        Route("/jobs", g(dash.job)),
        Route("/jobs/cancel", ag(dash.cancel), methods=["POST"]),
        Route("/crons", g(dash.crons)),
        Route("/crons/{name}/confirm", ag(dash.confirm_cron), methods=["POST"]),
        Route("/crons/{name}/{action:str}", ag(dash.act_on_cron), methods=["POST"]),
        Route("/limits", g(dash.limits)),
        Route("/workflows", g(dash.workflows_page)),
        Route("/workflows/{id}", g(dash.workflow)),
        Route("/workflows/{id}/confirm", ag(dash.confirm_workflow_cancel), methods=["POST"]),
        Route("/workflows/{id}/cancel", ag(dash.cancel_workflow), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=token, read_only=read_only)],
        lifespan=dash.lifespan,
    )
    app.state.dashboard = dash
    return app
