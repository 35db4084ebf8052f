"""The binding on the wire: job <-> AMQP message (body, properties, headers) and entity descriptions.

Pure Python: nothing here imports kombu or py-amqp.
"""

from ojs_kombu.wire.codec import CONTENT_TYPE, OutgoingMessage, decode, encode
from ojs_kombu.wire.entities import BindingSpec, ExchangeSpec, QueueOptions, QueueSpec, normalise_arguments
from ojs_kombu.wire.headers import Header, error_headers, strip_death_headers

__all__ = [
    "CONTENT_TYPE",
    "BindingSpec",
    "ExchangeSpec",
    "Header",
    "OutgoingMessage",
    "QueueOptions",
    "QueueSpec",
    "decode",
    "encode",
    "error_headers",
    "normalise_arguments",
    "strip_death_headers",
]
