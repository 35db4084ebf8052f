"""The kombu message the ``ojs://`` channel hands the framework for a job delivery.

kombu's consumer turns each raw py-amqp message into a ``kombu.Message``
(``Channel.message_to_python``) and Celery's worker then decodes its body (the
strategy reads ``message.payload``) in the worker's main process, the one that
reads the broker and feeds the pool.  A job delivery is built by the channel
from the job it already decoded, so it is made a kombu message at once, and the
``[args, kwargs, embed]`` its body was just written from is its decoded payload:
no ``amqp.Message`` in between, and no second parse of the body.
"""

from __future__ import annotations

from typing import Any

from kombu.message import Message

from ojs_kombu.transport.settings import TaskMessage


class DecodedMessage(Message):
    """A kombu message whose body comes with its decoded payload.

    Parameters:
        channel: the channel the job was delivered on (acks and rejects go there).
        task: the framework task message (its ``payload`` may be None: the body is then decoded as usual).
        delivery_info: the delivery's ``delivery_info`` (``delivery_tag`` included).
    """

    def __init__(self, channel: Any, task: TaskMessage, delivery_info: dict[str, Any]):
        properties = task.properties
        properties["application_headers"] = task.headers  # as on a py-amqp message: Celery copies them along
        super().__init__(  # type: ignore[no-untyped-call]  # kombu's Message is not annotated
            body=task.body,
            delivery_tag=delivery_info["delivery_tag"],
            content_type=properties.get("content_type"),
            content_encoding=properties.get("content_encoding"),
            delivery_info=delivery_info,
            properties=properties,
            headers=task.headers,
            channel=channel,
        )
        self._payload = task.payload

    @property
    def handed_over(self) -> Any:
        """The payload the transport built, once the consumer decoded the message to it; else None
        (not decoded yet, or decoded by kombu: there was none, or a content type the consumer
        does not accept was refused)."""
        payload = self._payload
        return payload if payload is not None and self._decoded_cache is payload else None

    def _decode(self) -> Any:
        """The payload; the body decoded by kombu when there is none or its content type is not accepted.

        kombu calls it once (``decode`` keeps the result); for a content type the consumer does not
        accept, kombu's own decoding raises ``ContentDisallowed`` as for any message.
        """
        if self._payload is not None and (self.accept is None or self.content_type in self.accept):
            return self._payload
        return super()._decode()  # type: ignore[no-untyped-call]


__all__ = ["DecodedMessage"]
