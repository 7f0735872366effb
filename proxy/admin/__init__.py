"""The admin API (/admin/api/...) and the dashboard (/admin): see and steer the system.

A FastAPI sub-application mounted by proxy/app.py, so the hot path stays plain Starlette.
Invariant: every /admin/api route but the OpenAPI schema needs the admin bearer token, and
every answer that is not a success is a 4xx/503 in the OpenAI error shape, never a 500.
"""
