"""Multi-turn tool tasks: a task family for agents (issue 44 item 3).

Questions that need a tool, or two in sequence, before they can be answered: a calculator,
unit conversion and a lookup in a database of fictional towns and products. Graded on the
outcome (the final answer's number), with a train and a held-out split.

Modules: tools (the tool definitions in the OpenAI `tools` format, their implementations,
clear errors for malformed calls), facts (the lookup database), tasks (the seeded tasks,
splits, reference answers and gold calls; the task-set rows), grading (the `python:`
grader), teacher (the scripted stand-in teacher: the gold trajectory of a task), agent (the
bundled harness for `onthejob rollout`), pydantic_ai_agent and openai_agents_agent (the same
tasks driven by third-party frameworks, unchanged; what they share: frameworks).
`python -m learner.rollout.tool_tasks` writes the task sets. Invariant: a task's reference
answer is the result of its gold calls as the tools compute it, so the gold sequence solves
every task.
"""
