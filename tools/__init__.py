"""This repository's own tooling, run from its root and never shipped in the wheel (DESIGN §22).

What the repository's tests, examples and benchmarks need besides RabbitMQ (which
:mod:`ojs_kombu.testing` provisions, for users' tests too):

* :mod:`tools.redis`: a private ``redis-server`` (Celery's Redis result backend in ``tests/celery``);
* :mod:`tools.java`: a Java runtime for PySpark (``ojs_kombu.spark``'s tests, example, benchmark);
* :mod:`tools.browser`: headless Chromium and chromedriver (``tests/dashboard``);
* :mod:`tools.schema`: the official OJS JSON Schemas, to validate the envelopes the tests see.

``make setup`` runs ``python -m tools.redis install``, ``python -m tools.java install`` and
``python -m tools.browser install``.  They reuse the apt and server helpers of
:mod:`ojs_kombu.testing._servers` (the same repository, versioned together).
"""
