"""Black-box harnesses for the rollout tests: started as subprocesses, configured only by
their base URL environment, their arguments and a few ONTHEJOB_HARNESS_* variables."""
