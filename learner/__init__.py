"""Learner: post-trains the served model from recorded traffic."""
