"""Toy tasks and their rewards, which the tiny random model learns in a few steps: the
benches measure learning on them (bench/learning_per_step.py, bench/tenants.py, ...) and the
tests check that learning happens; both import them from here, neither imports the other.

Their rewards are Python graders, named as the learner takes them:
``python:learner.toys.letter:share_of_a_reward``, ``python:learner.toys.tenants:tenant_reward``.
"""
