"""Celery over the OJS AMQP binding (see the Celery issue; not yet implemented)."""
