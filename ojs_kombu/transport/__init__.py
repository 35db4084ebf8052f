"""The ``ojs://`` / ``ojss://`` kombu transports: kombu and Celery task traffic on the OJS wire.

Importing :mod:`ojs_kombu` registers the aliases, so ``kombu.Connection("ojs://…")``
and Celery's ``broker_url="ojs://…"`` resolve to these classes; the config-only
path is ``broker_transport="ojs_kombu.transport:Transport"``.

The transport is py-amqp's, with a :class:`Channel` that rewrites task traffic
(DESIGN §2–§6) and leaves everything else exactly as ``pyamqp://`` would:

* **Job queues.**  A queue declared through the channel is an OJS job queue when
  it is durable, non-exclusive and non-auto-delete, is not listed in
  ``passthrough_queues``, and is used the way task queues are: on the default
  exchange (kombu's ``Queue("email")``) or bound to a direct exchange (Celery's
  ``celery`` queue).  Declaring it declares ``ojs.queue.{q}`` with its dead
  letter queue and bindings; consuming, purging or deleting it acts on
  ``ojs.queue.{q}``.  Its bindings to direct exchanges are remembered (for
  routing), not created.  Queue names that are not valid OJS names are mapped
  (:func:`~ojs_kombu.model.naming.ojs_queue_for`: ``Reports_High`` -> ``reports-high``).
* **Plain queues.**  A queue bound to a **fanout, topic or headers** exchange is
  never a job queue: a message there is meant for every bound queue, which an
  OJS job is not.  kombu declares a queue's exchange right before the queue,
  so a durable queue declared just after such an exchange on the same channel
  is declared as a plain queue; a job queue bound to such an exchange later is
  declared as the plain queue it was meant to be and bound for real (the
  ``ojs.queue.{q}`` already declared for it stays, empty).  An exchange's type
  is known when it was declared through the transport (by any connection with
  the same prefix); a binding to an exchange of unknown type is taken for a
  direct one.  Plain
  queues, and every other queue (exclusive, auto-delete, transient), behave as
  on ``pyamqp://``: their messages, requeues and redeliveries are untouched.
* **Publishing.**  A task message (recognised by the codec a framework adapter
  registered: Celery protocol v2 for ``ojs_celery``, see :mod:`ojs_celery.protocol`) addressed to a job queue
  becomes an OJS envelope published with confirms and ``mandatory`` to
  ``ojs.exchange.direct``; a retried task (``retries > 0``) goes to
  ``ojs.queue.retry.{q}.{ms}`` (the delay rounded up to the retry ladder); a
  task with a future ETA goes through the scheduling cascade.  A ``Basic.Return``
  or ``Basic.Nack`` raises :class:`~ojs_kombu.errors.UnroutableError` /
  :class:`~ojs_kombu.errors.PublishNackedError`.  Any other message addressed
  to a job queue is re-addressed to ``ojs.exchange.direct`` with its body
  untouched; everything else (fanout/topic/headers exchanges, remote control,
  events, ``rpc://`` results, exchanges the transport does not know) passes
  through untouched.
* **Consuming.**  An OJS envelope delivered from a job queue is handed to the
  consumer as the framework's task message (an envelope from any other OJS
  producer becomes a task message for the task whose name maps to its
  ``type``): a kombu message that carries its body already decoded
  (:mod:`~ojs_kombu.transport.message`).  The runtime's :class:`~ojs_kombu.runtime.settle.Settler` (the
  Worker's) triages it first: a ``redelivered`` job (the worker running it
  died) counts as a failed attempt (``worker_lost``); a job that arrives more
  than :data:`~ojs_kombu.transport.channel.EARLY_TOLERANCE_MS` before its
  ``scheduled_at`` goes back into the cascade (less is left to Celery, which
  waits for the ETA itself); an invalid envelope goes to its dead letter queue
  with ``x-ojs-error-code``.  Expired jobs are left to Celery (it records them
  as revoked).  Other messages pass through untouched.
* **Settling.**  ``basic_reject(requeue=False)`` sends a real ``Basic.Nack``
  (dead-lettered into ``ojs.queue.dlx.{q}``); ``requeue=True`` on a job never
  requeues: it counts a failed attempt (``requeued``: retry queue, confirmed,
  then ack; or the dead letter queue once the attempts are spent), and so does
  ``basic_nack(tag, requeue=True)`` of one job (RabbitMQ 4.3 does not count a
  nack's return towards a quorum queue's delivery limit).  Job
  deliveries count ``ojs_amqp_messages_consumed/acked/nacked_total`` like the
  Worker's.  ``basic_qos`` is always ``global=False``.  A broker-initiated
  consumer cancel is logged and counted, then raised as kombu's recoverable
  ``ConsumerCancelled`` so the consumer re-declares and re-consumes.
* **Control plane.**  Before the first ``Basic.Consume`` of a job queue on a
  connection, its control stream ``ojs.queue.control.{q}`` is replayed on a
  channel of its own, and then read live (:mod:`~ojs_kombu.transport.control`):
  a cancelled job is acked and dropped on delivery (never reaching the
  framework), every cancel is handed to the ``on_cancel`` hook, and a paused
  queue's consumer is cancelled (``Basic.Cancel``) until the queue is resumed
  (``Basic.Consume`` with the same consumer tag).  A reconnection replays again.
* **Event loop.**  Under kombu's event loop (Celery's worker) the socket is read
  through :class:`~ojs_kombu.amqp.framing.FrameReader`, every complete frame
  per ``recv``, and a job queue consumer's deliveries are decoded by it directly
  (no py-amqp message in between); frames left in its buffer by any other read
  are dispatched before the loop polls again, and the loop is woken so that
  nothing they schedule waits for a poll timeout.  The acks made on the loop's
  thread leave together, right before it polls (one ``Basic.Ack`` frame per
  delivery, ``multiple=false``), and at once once the loop is closing.

Transport options (``transport_options=`` / Celery ``broker_transport_options``),
removed before the py-amqp connection sees them:

``prefix``
    multi-tenant entity prefix (``tenant1.ojs.queue.email``).
``queue_options``
    a :class:`~ojs_kombu.wire.entities.QueueOptions` or a dict of its fields for every job queue
    (``{"delay_queue_type": None}``: retry queues and cascade levels of the job queue's type
    instead of the quorum default).
``queue_type``
    ``"quorum"``: every job queue with its DLQ, retry queues and the scheduling cascade is a
    quorum queue (``docs/cluster.md``); sets ``queue_options.queue_type``.
``passthrough_queues``
    durable queue names that stay plain AMQP queues.
``codec``
    the task message codec: an object, a class or ``"module:Class"``.  Default: the codec a
    framework adapter registered when imported (:func:`~ojs_kombu.transport.settings.register_codec`;
    ``import ojs_celery`` registers Celery's).  Without one, no message is a task message
    (everything published passes through), and a job delivered raises ``LookupError`` (it
    stays unacked).
``confirm_timeout``
    seconds to wait for the confirm of a job publish (default 30).
``unique_backend``
    where the locks of unique jobs (``ojs_unique``) are: unset (RabbitMQ queues) or a Redis URL
    (``redis://host:6379/0``), as ``Client(unique_backend=...)``: the same for every publisher
    and worker of a deployment (``docs/unique-jobs.md``).
``unique_replace_timeout``
    seconds an ``on_conflict="replace"`` waits for a running holder to end once cancelled
    (asked by INFO, as the Client does), before it is rejected with ``DuplicateJobError``
    (default 10, as ``Client(unique_replace_timeout=...)``).
``workflow_retention``
    seconds an ended workflow's record stream (a Celery chord is a workflow) is kept before its
    sweep job deletes it (default 86400: 24 h); ``None``: kept (``docs/workflows.md``, Clean-up).

``on_cancel``
    called with the id of every cancelled job read from a control stream
    (replays included): a callable or ``"module:function"``.  ``ojs_celery``
    sets it to revoke the task (:mod:`ojs_celery.control`).

``lifecycle``
    where the transport's Settler emits the lifecycle events of what it settles
    itself (``cancelled`` on delivery, ``failed``/``retried`` of a redelivered
    job ...): a :class:`~ojs_kombu.runtime.lifecycle.Lifecycle`, a function
    returning one, or ``"module:function"``.  ``ojs_celery`` sets it to the
    worker process's (:func:`ojs_celery.lifecycle.worker_lifecycle`).

``info``
    answers INFO requests read from the control streams: a function
    ``info(job_id) -> JobInfo | None`` or ``"module:function"``; ``ojs_celery``
    sets it to the worker process's :class:`~ojs_kombu.runtime.activity.Activity`.

``deduplicate``
    execution de-duplication, as ``Worker(deduplicate=True)`` (``docs/reliability.md``): each job
    queue consumed gets a :class:`~ojs_kombu.runtime.completed.CompletedLog` of its own
    (:mod:`~ojs_kombu.transport.completed`), replayed before its first ``Basic.Consume``; a
    delivery whose job id completed already is acked without reaching the framework; an ack the
    framework marked a success (:meth:`Channel.note_success`, ``ojs_celery`` does on an
    ``acks_late`` success) is sent once the id's record is confirmed: under kombu's event loop
    (Celery's worker) the loop is woken for it, otherwise it leaves with the next ``drain_events``.
    Other acks (a retry's) record nothing.

``completed_options``
    bounds of what ``deduplicate`` remembers: a :class:`~ojs_kombu.wire.completed.CompletedOptions`
    or a dict of its fields.

``confirm_publish`` keeps its py-amqp meaning for pass-through traffic; job
messages are always confirmed.

Modules: :mod:`~ojs_kombu.transport.settings` (options, the codec protocol),
:mod:`~ojs_kombu.transport.queues` (what is learnt about queues, per prefix),
:mod:`~ojs_kombu.transport.state` (per-connection routing, declarations, task
publishing), :mod:`~ojs_kombu.transport.control` (the control streams read), :mod:`~ojs_kombu.transport.completed`
(the completed job ids, ``deduplicate``), :mod:`~ojs_kombu.transport.settlement` (the Settler over a
channel), :mod:`~ojs_kombu.transport.message` (the kombu message of a job delivery), :mod:`~ojs_kombu.transport.channel` (:class:`Channel`) and
:mod:`~ojs_kombu.transport.transport` (:class:`Transport`, :class:`SSLTransport`).
"""

from ojs_kombu.transport.channel import EARLY_TOLERANCE_MS, Channel
from ojs_kombu.transport.queues import QueueMap, queue_map
from ojs_kombu.transport.settings import Settings, TaskCodec, register_codec
from ojs_kombu.transport.state import ConnectionState
from ojs_kombu.transport.transport import Connection, SSLTransport, Transport, register_aliases

__all__ = [
    "EARLY_TOLERANCE_MS",
    "Channel",
    "Connection",
    "ConnectionState",
    "QueueMap",
    "SSLTransport",
    "Settings",
    "TaskCodec",
    "Transport",
    "queue_map",
    "register_aliases",
    "register_codec",
]
