"""Dramatiq over the OJS AMQP binding (see the Dramatiq issue; not yet implemented)."""
