"""Thin HTTP routers."""
