"""Start-up: what the replicas serve, what the trainer computes in, and the tolerance swaps
are verified with; version 0 on a first start; restoring what the store says serves."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from learner import control
from learner.canary.starts import BY
from learner.checkpoint import load_model, save_checkpoint
from learner.grouping import Baselines
from learner.hindsight import HintFrame
from learner.layout import is_adapter
from learner.loop.guarding import Guarding
from learner.loop.publish import Publishing
from learner.loop.state import LEARNER, LEASE_WAIT, PROBE_TEXT, LoopState, RestoreFailed
from learner.loop.weights import Weights
from learner.swap import lease
from learner.swap.adapter_memory import adapter_memory
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import (
    HALF_PRECISION_CHECKED_TOLERANCE,
    Fingerprint,
    Probe,
    checked_tolerance,
    current_version,
    served_adapters,
    served_dtype,
    tolerance_for,
)
from learner.swap.transfer import transfer_support
from learner.swap.versions import serve_version_held
from store import (
    canaries,
    clock,
    gates,
    grade_queue,
    learner_state,
    policy_versions,
    training_steps,
)
from store.control import read_heartbeat
from store.tasks import TaskTable, upsert_tasks

log = logging.getLogger("onthejob.learner")


class StartUp:
    """Start the learner, and make the replicas serve what the store says serves."""

    def __init__(
        self, state: LoopState, weights: Weights, publishing: Publishing, guarding: Guarding
    ) -> None:
        self.state = state
        self.weights = weights
        self.publishing = publishing
        self.guarding = guarding

    # -- start-up ---------------------------------------------------------------------
    def start(self) -> None:
        state, lineage = self.state, self.state.lineage
        if state.config.tasks:
            self._load_tasks(Path(state.config.tasks))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(state.model_dir))
        state.probe = Probe(prompt_token_ids=list(tokenizer(PROBE_TEXT)["input_ids"]))
        state.hint_frame = HintFrame.of(tokenizer) if state.config.hindsight > 0 else None
        if isinstance(state.hint_frame, str):
            log.warning("--hindsight has no effect on this model: %s", state.hint_frame)
        dtypes = {served_dtype(upstream) for upstream in state.config.upstreams}
        checker = FullWeightPublisher(state.config.upstreams, probe=state.probe)
        why_not = checker.weights_checkable(state.model_dir)
        state.weights_checked = why_not is None
        state.tolerance = self._verify_tolerance(dtypes, why_not)
        state.trainer_config = dataclasses.replace(
            state.trainer_config, precision=self._precision(dtypes)
        )
        state.transport = self._transport()
        if state.config.lora:
            state.adapter_memory = adapter_memory(state.config.lora_load_from, state.checkpoints)
        # a learner killed mid-publish left its lease behind: take it over at once
        with lease.held(state.engine, state.holder, wait=LEASE_WAIT, steal_prefix=LEARNER):
            self._serve_parent_if_unsaved()
            with state.engine.begin() as conn:
                lineage.serving = policy_versions.serving_version(conn)
                state.step = training_steps.last_step(conn)
                states = {key: learner_state.get_state(conn, key) for key in Baselines.KEYS}
                lineage.baselines = Baselines.from_states(states, state.config.type_baseline)
                state.own_set_at = control.own_set_at(state.own_knobs, read_heartbeat(conn))
            adopted = lineage.serving is None and self._adopt_served_weights()
            assert lineage.serving is not None
            source = Path(lineage.serving["checkpoint_path"])
            if lineage.trainer is None:
                lineage.trainer = self.weights.build(source)
            self.weights.load_optimizer(source)
            lineage.trainer_is_serving = True
            lineage.publisher = self.publishing.publisher_for(source)
            if not adopted:
                # always swap in what the database says serves, verified: a learner that died
                # mid-swap may have left a replica fenced off or holding unpublished weights
                self._restore_locked()
        log.info(
            "learner ready: serving %s (step %d), graders %s, traffic of %s",
            lineage.serving["version"],
            state.step,
            ", ".join(state.config.graders),
            "the client keys " + ", ".join(state.config.keys) if state.config.keys else "everyone",
        )
        if state.config.guard:
            self.guarding.start(Path(state.config.guard))

    def _serve_parent_if_unsaved(self) -> None:
        """A transfer serves a version before its checkpoint is written (learner/loop/
        publish.py); a learner killed in between leaves a serving version without files,
        which nobody can train on, restore or roll back to. Its parent serves again, as an
        operator's rollback would make it (``PARENT+rollback-N``), and training goes on from
        there: one step is lost, no weights that are not on disk keep serving."""
        state = self.state
        with state.engine.connect() as conn:
            serving = policy_versions.serving_version(conn)
        if serving is None or Path(serving["checkpoint_path"]).exists():
            return
        if not serving["parent"]:
            raise RestoreFailed(
                f"the serving version {serving['version']} has no checkpoint at "
                f"{serving['checkpoint_path']} and no parent to serve instead"
            )
        log.error(
            "the serving version %s has no checkpoint (the learner stopped before writing "
            "it): serving its parent %s again",
            serving["version"],
            serving["parent"],
        )
        serve_version_held(
            state.engine,
            state.config.upstreams,
            serving["parent"],
            state.holder,
            drain_timeout=state.config.swap_drain_timeout,
        )

    def _verify_tolerance(self, dtypes: set[str | None], unchecked: str | None) -> float:
        """The probe tolerance: the configured one, else the one for the dtype the replicas
        serve in (the loosest, should they differ). ``unchecked``: why the weights cannot be
        compared exactly (None: they are, at every swap)."""
        log.info(
            "vLLM serves in %s; %s",
            ", ".join(map(str, dtypes)),
            "its weights are compared exactly with each checkpoint's"
            if unchecked is None
            else f"the probe alone verifies swaps, no exact weight check ({unchecked})",
        )
        if self.state.config.verify_tolerance is not None:
            return self.state.config.verify_tolerance
        tolerance = max(tolerance_for(dtype) for dtype in dtypes)
        if unchecked is None:
            loosened = max(
                checked_tolerance(dtype, HALF_PRECISION_CHECKED_TOLERANCE) for dtype in dtypes
            )
            log.info(
                "swaps verify the probe within %g, within %g once the weights matched",
                tolerance,
                max(tolerance, loosened),
            )
        else:
            log.info("swaps verify the probe within %g", tolerance)
        return tolerance

    def _transport(self) -> str:
        """disk or transfer: what was asked for, or (auto) the fastest the replicas support;
        asking for transfer where a replica lacks it stops the start with why."""
        state = self.state
        if state.config.lora:
            return "disk"  # adapters are loaded by name (learner/swap/lora_publisher.py)
        wanted = state.config.transport
        why_not = None if wanted == "disk" else transfer_support(state.config.upstreams)
        if wanted == "transfer" and why_not is not None:
            raise ValueError(f"--transport transfer: {why_not}")
        transport = "transfer" if wanted != "disk" and why_not is None else "disk"
        log.info(
            "full weights reach the replicas by %s%s",
            transport,
            f" ({why_not})" if wanted == "auto" and why_not else "",
        )
        return transport

    def _precision(self, dtypes: set[str | None]) -> str:
        """What the trainer computes in: the configured precision, else bf16 (with float32
        masters: the full weights, or a LoRA adapter on its bf16 base) when every replica
        serves bf16, so checkpoints hold exactly the weights the trainer scores with."""
        precision = self.state.config.precision
        if precision == "auto":
            precision = "bfloat16" if dtypes == {"bfloat16"} else "float32"
        log.info("the trainer computes in %s", precision)
        return precision

    def _adopt_served_weights(self) -> bool:
        """First start: the weights vLLM serves now become version 0, with the probe they
        pass; its checkpoint is written by us so it always holds lm_head.weight (a rollback
        to it must be exact). False when vLLM serves something else (an adapter of another
        run, other weights): version 0 is then the base, swapped in like after a crash."""
        state, lineage = self.state, self.state.lineage
        base = state.checkpoints / "base"
        if not base.exists():
            save_checkpoint(load_model(state.model_dir), base, source_dir=state.model_dir)
        lineage.trainer = self.weights.build(base)
        fingerprint = Fingerprint.of(state.probe, lineage.trainer.logprobs_of, state.tolerance)
        version = current_version(state.config.upstreams[0])
        serves_base = version not in served_adapters(state.config.upstreams[0])
        if serves_base:
            checker = FullWeightPublisher(
                state.config.upstreams, probe=state.probe, check_weights=state.weights_checked
            )
            for upstream in state.config.upstreams:
                why = checker.serves(upstream, base, fingerprint)
                if why is not None:
                    log.warning(
                        "%s does not serve --model's weights (%s): swapping them in", upstream, why
                    )
                    serves_base = False
        if not serves_base:
            version = f"base-{os.urandom(3).hex()}"
        with state.engine.begin() as conn:
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=policy_versions.next_ordinal(conn),
                parent=None,
                checkpoint_path=str(base),
                status="serving",
                probe=fingerprint.state(),
            )
            lineage.serving = policy_versions.serving_version(conn)
        return serves_base

    def restore(self) -> None:
        """Make every replica serve what the database says serves, verified; unless it was
        only closed gates that called for it and, now that we hold the lease, none is: they
        were another publisher's, which finished meanwhile (an admin rollback's swap between
        `gates_left_closed`'s two reads), and restoring would swap the same weights again."""
        state = self.state
        state.activity = "restoring the serving version"
        with lease.held(state.engine, state.holder, wait=LEASE_WAIT):
            if state.lineage.needs_restore or self._closed_gates():
                self._restore_locked()

    def _restore_locked(self) -> None:
        with self.state.stopping.swap():
            self._restore_verified()

    def _restore_verified(self) -> None:
        state, lineage = self.state, self.state.lineage
        assert lineage.serving is not None and lineage.publisher is not None
        assert lineage.trainer is not None
        with state.engine.connect() as conn:
            serving = policy_versions.serving_version(conn)
        assert serving is not None
        if serving["version"] != lineage.serving["version"]:
            self.weights.follow(serving)
        fingerprint = Fingerprint.from_state(serving["probe"], at_least=state.tolerance)
        result = lineage.publisher.rollback(
            Path(serving["checkpoint_path"]),
            serving["version"],
            fingerprint=fingerprint,
            expected=None if fingerprint is not None else lineage.trainer.logprobs_of,
        )
        if not (result.ok and result.opened):
            lineage.needs_restore = True
            raise RestoreFailed(f"could not restore {serving['version']}: {result.error}")
        if fingerprint is None and result.fingerprint is not None:
            with state.engine.begin() as conn:
                policy_versions.set_version_probe(
                    conn, version=serving["version"], probe=result.fingerprint.state()
                )
            lineage.serving["probe"] = result.fingerprint.state()
            lineage.publisher.last_good_fingerprint = result.fingerprint
        lineage.needs_restore = False
        self._roll_back_unserved_candidate()

    def _roll_back_unserved_candidate(self) -> None:
        """A restore serves what serves on every replica, a full-weight candidate's too: the
        shared policy's running canary with such a candidate (its learner stopped, or its
        replicas had to be restored) has no arm left, and is rolled back, with why."""
        now = clock.now()
        with self.state.engine.begin() as conn:
            running = canaries.running_for(conn, None)
            if running is None:
                return
            canary = canaries.get_canary(conn, running)
            candidate = (
                None
                if canary is None
                else policy_versions.version(conn, version=canary["candidate"])
            )
            if candidate is None or is_adapter(Path(candidate["checkpoint_path"])):
                return
            canaries.roll_back(
                conn,
                canary_id=running,
                by=BY,
                reason=(
                    f"its full-weight candidate {candidate['version']} no longer serves on any "
                    "replica: every replica was given the serving version again (the learner "
                    "restarted, or restored the replicas)"
                ),
                now=now,
            )
        log.warning(
            "canary %s rolled back: its full-weight candidate %s no longer serves on any replica",
            running,
            candidate["version"],
        )

    def gates_left_closed(self) -> bool:
        """A publisher that died mid-swap (nobody holds the lease) may have left replicas
        fenced off. A hint only: the gates and the lease are read apart, so a swap that ended
        in between looks the same; `restore` decides under the lease."""
        return bool(self._closed_gates()) and lease.who(self.state.engine) is None

    def _closed_gates(self) -> set[str]:
        """Our replicas whose gates are closed."""
        lineage = self.state.lineage
        with self.state.engine.connect() as conn:
            closed = {g["upstream"] for g in gates.closed_gates(conn)}
        return closed & set(lineage.publisher.upstreams if lineage.publisher else [])

    def _load_tasks(self, path: Path) -> None:
        table = TaskTable.from_jsonl(path)
        rows = [
            {
                "key": t.key,
                "prompt": t.prompt,
                "answer": t.answer,
                "match": t.match,
                "tolerance": t.tolerance,
                "metadata": t.metadata,
            }
            for t in table.values()
        ]
        with self.state.engine.begin() as conn:
            upsert_tasks(conn, rows)
            grade_queue.retry_failed_now(conn)  # "no reference answer" may have one now
        self.state.tasks = table
        log.info("loaded %d tasks from %s", len(rows), path)
