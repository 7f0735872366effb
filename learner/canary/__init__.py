"""The live canary (issue 45): a new version earns its traffic. `sequential.py` compares two
arms with a test valid at every look; `watch.py` reads the traffic for signs of reward
hacking."""
