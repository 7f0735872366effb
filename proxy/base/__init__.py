"""The proxy's base layer: what every other part of the proxy builds on (errors, a call's
record and its token capture, the compatibility policy, request reading, client keys).
It imports no other proxy package (pyproject's [tool.importlinter] layers)."""
