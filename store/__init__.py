"""The data layer the proxy and the learner share (SQLAlchemy 2; the schema is owned by
Alembic in migrations/).

It imports neither proxy/ nor learner/ (`make lint` checks it). The tables are split by
owner in `store.models`; each query module is named after what it holds and leaves the
transaction to its caller. The export format (`store.export`) and the training samples it
is built from (`store.samples`) are the public interface to the recordings.
"""
