"""The Celery transport: the web side's pending-request table and publisher, the worker that hosts an
engine per GPU, and what travels between them over Redis (wire format, outbox, presence, ordering)."""
