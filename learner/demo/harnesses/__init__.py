"""Bundled agent harnesses, run as black-box subprocesses like a user's own."""
