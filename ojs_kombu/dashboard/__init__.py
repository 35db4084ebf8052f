"""``ojs-amqp dashboard``: a small web dashboard over the control plane (needs the ``dashboard`` extra).

Pages: the overview (jobs per minute / hour, wait and run times, queues, depth sparklines, rates,
totals), a queue, its dead letters (filter, select, replay or purge after a confirmation), the workers
(pause / resume a queue), a job's story (timeline, INFO, cancel), the crons (runs, leader, enable /
disable), the limits and unique locks held (:mod:`ojs_kombu.dashboard.holds`), and the workflows
(:mod:`ojs_kombu.dashboard.workflows` finds them, :mod:`ojs_kombu.dashboard.wfgraph` draws each one's
steps; cancel).
:mod:`ojs_kombu.dashboard.app` builds the Starlette application;
:mod:`ojs_kombu.dashboard.security` holds its token, CSRF and read-only checks;
:mod:`ojs_kombu.dashboard.overview` the queue rows it shares with ``ojs-amqp status``;
:mod:`ojs_kombu.dashboard.render` how values and times read; :mod:`ojs_kombu.dashboard.replays` the
replays it made; :mod:`ojs_kombu.dashboard.stats` the charts' history, read from the events stream;
:mod:`ojs_kombu.dashboard.story` a job's timeline; :mod:`ojs_kombu.dashboard.svg` the charts.
An open page updates itself by fetch polling (``static/live.js``, served by the package;
docs/operations.md, "Live updates").
This package's ``__init__`` imports nothing, so ``overview`` works without Starlette.
"""
