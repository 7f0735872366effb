"""The supervised stage (`learn --supervised-steps N`): recorded trajectories rendered again
with the student's own chat template and tokenizer (render.py), trained with cross-entropy on
the assistant turns (learner/trainer.py `Trainer.supervised_step`), before GRPO goes on from
the student's own traffic (learner/loop/supervised.py)."""
