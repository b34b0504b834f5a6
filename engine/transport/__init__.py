"""Messaging: the Transport port, RabbitMQ's implementation and the queue topology."""
