"""The `onthejob` command line, above the proxy and the learner (pyproject's
[tool.importlinter]): `cli.main` builds the parser from each command group's `register`."""
