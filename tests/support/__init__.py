"""Helpers the tests share (issue 24 part 5 moves the rest of tests/*.py helpers here)."""
