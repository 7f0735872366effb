"""Publishing a step: checkpoint, verified hot-swap and the record, at once, under the publish
lease; retention after it. Where the scope's canary settings give it a share (learner/canary/
starts.py), an adapter is loaded and verified but serves only a canary's share of the scope:
it is recorded as the canary's candidate, its canary started in the same transaction, and
what serves the scope stays as it was until the canary is decided (learner/loop/step.py).
Full weights do the same on some of two or more replicas, which serve what the others do
again when the canary is rolled back (`withdraw_candidate`)."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from learner import retention
from learner.canary.settings import CanarySettings
from learner.canary.starts import CanaryStarts, candidate_replicas
from learner.checkpoint import checkpoint_tensors, save_checkpoint
from learner.grouping import Baselines
from learner.layout import served_base
from learner.loop.state import LEASE_WAIT, LoopState, save_baselines
from learner.loop.weights import Weights
from learner.lora import save_adapter, write_adapter
from learner.swap import lease, orphan_adapters
from learner.swap.adapter_memory import AdapterWrite
from learner.swap.full_publisher import FullWeightPublisher, PublisherSettings
from learner.swap.lora_publisher import LoraPublisher, tenant_pointer
from learner.swap.publisher import (
    HALF_PRECISION_CHECKED_TOLERANCE,
    Fingerprint,
    PublishError,
    PublishResult,
    SwapMetrics,
    WeightPublisher,
)
from learner.swap.transfer import TransferMetrics, WeightFileTransfer, transfer_publisher
from store import canaries, clock, grade_queue, policy_versions, training_steps
from store.json_types import JsonObject

if TYPE_CHECKING:
    import torch

log = logging.getLogger("onthejob.learner")


class Publishing:
    """Publish, verify and record a step's version of the lineage."""

    def __init__(self, state: LoopState, weights: Weights) -> None:
        self.state = state
        self.weights = weights
        self.canary_starts = CanaryStarts(state.engine, state.config)

    def publish_step(
        self,
        step: int,
        metrics: JsonObject,
        considered: list[str],
        baselines: Baselines,
    ) -> PublishResult | None:
        """Checkpoint, publish and record one step under the publish lease; None when an
        operator changed what serves while it trained (the step is dropped). The learner's
        step, serving version and baselines follow the record as soon as it commits, so
        that nothing after it (the store or vLLM going away) can make it train again."""
        state, lineage = self.state, self.state.lineage
        assert lineage.trainer is not None and lineage.publisher is not None and lineage.serving
        state.activity = f"publishing step {step}"
        with lease.held(state.engine, state.holder, wait=LEASE_WAIT):
            with state.engine.connect() as conn:
                serving = policy_versions.serving_version(conn, state.tenant)
            if serving is not None and serving["version"] != lineage.serving["version"]:
                log.info("step %d trained on weights an operator replaced: dropped", step)
                self.weights.follow(serving)
                return None
            version, target = self._new_version(step)
            canary = self._canary()
            # transfer: the replicas load the trainer's tensors from memory, and the
            # checkpoint is written once the version serves (rollbacks and resumes read it)
            tensors = self.served_tensors() if self.file_transport() is not None else None
            # an adapter: the publisher writes it (into memory first where vLLM loads it
            # from there, learner/swap/adapter_memory.py), its checkpoint before the record
            write = self._adapter_writer(metrics) if self.adapter_publisher() else None
            if tensors is None and write is None:
                self._save_checkpoint_files(step, target, metrics)
            parent = lineage.serving["version"]

            def record(result: PublishResult) -> None:
                """Verified, not yet serving: the version, the step and its batch, at once."""
                self._record_published(
                    step, version, target, parent, result, metrics, considered, baselines, canary
                )

            # a stop asked for from here on comes once the outcome is recorded (stopping.py)
            with state.stopping.swap():
                try:
                    result = self._publish(target, version, record, tensors, write, canary)
                except BaseException:
                    lineage.needs_restore = True  # the replicas may still be fenced off
                    raise
                finally:
                    if tensors is not None:
                        # whatever happened: the version's record names this directory
                        self._save_checkpoint_files(step, target, metrics)
                    elif write is not None and target.is_dir():
                        self._save_optimizer_state(step, target, metrics)
                if result.ok:
                    lineage.needs_restore = not result.opened
                    self._keep_candidate_state(target, version, canary)
                    self._prune()
                    return result
                self._record_failed(step, version, target, result, metrics, considered, baselines)
                return result

    def _record_published(
        self,
        step: int,
        version: str,
        target: Path,
        parent: str,
        result: PublishResult,
        metrics: JsonObject,
        considered: list[str],
        baselines: Baselines,
        canary: CanarySettings | None = None,
    ) -> None:
        """A verified version, about to serve (`canary`: a canary's share of its scope, the
        canary started with it): it, its step and its batch recorded at once; the learner
        follows the record as soon as it commits."""
        state, lineage = self.state, self.state.lineage
        metrics.update(_swap_metrics(result), **self._transfer_metrics())
        with state.engine.begin() as conn:
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=policy_versions.next_ordinal(conn),
                parent=parent,
                checkpoint_path=str(target),
                status="serving" if canary is None else policy_versions.CANARY,
                swap_seconds=result.swap_seconds,
                metrics=metrics,
                probe=None if result.fingerprint is None else result.fingerprint.state(),
                tenant=state.tenant,
            )
            self._record_step(conn, step, version, metrics, considered, baselines)
            recorded = policy_versions.version(conn, version=version)
            canary_id = None if canary is None else self._start_canary(conn, version, step, canary)
        state.step, lineage.baselines = step, baselines
        if canary_id is not None:
            # what serves stays; the trainer holds the candidate until the canary is decided
            lineage.canary = canary_id
            return
        lineage.serving = recorded
        lineage.trainer_is_serving = True

    def _start_canary(
        self, conn: Connection, version: str, step: int, canary: CanarySettings
    ) -> int:
        """The canary of the version being recorded; one that an operator started for the
        scope meanwhile fails the publish (the version serves nobody, the step is spent)."""
        try:
            return self.canary_starts.start(
                conn,
                tenant=self.state.tenant,
                candidate=version,
                step=step,
                settings=canary,
                now=clock.now(),
            )
        except canaries.CanaryError as exc:
            raise PublishError(f"not started as a canary: {exc}") from exc

    def _canary(self) -> CanarySettings | None:
        """The settings of the canary the lineage's new version starts (None: it serves
        its whole scope at once); a canary's candidate is an adapter, or full weights on some
        of the replicas."""
        publisher = self.state.lineage.publisher
        assert publisher is not None
        adapter = isinstance(publisher, LoraPublisher)
        settings = self.canary_starts.settings_for(
            self.state.tenant, adapter=adapter, replicas=len(publisher.upstreams)
        )
        if isinstance(publisher, LoraPublisher):
            # read at each publish, as a tenant's own settings may change while it runs
            publisher.keep = self._adapters_kept(canary=settings is not None)
        return settings

    def _adapters_kept(self, *, canary: bool) -> int:
        """Adapters a lineage keeps loaded: every version a sample may still be trained
        from, so a request in flight finishes on the adapter it started with; and a slot more
        for a canary's candidate, loaded beside what serves (kept first). Without a canary
        none is held for it: --max-loras is sized without."""
        return self.state.config.max_staleness + 1 + int(canary)

    def _keep_candidate_state(
        self, target: Path, version: str, canary: CanarySettings | None
    ) -> None:
        """A canary's candidate: its optimizer state beside it, whatever
        --optimizer-state-every says, so a promotion trains on from exactly this step."""
        if canary is None:
            return
        if not Weights.optimizer_path(target).exists():
            self.weights.save_optimizer(target)
        log.info(
            "%s serves a canary's share of %s: %s",
            version,
            "the shared policy" if self.state.tenant is None else f"tenant {self.state.tenant}",
            canary.summary(),
        )

    def _new_version(self, step: int) -> tuple[str, Path]:
        """The new version's name and checkpoint directory (emptied)."""
        state = self.state
        # unique: a step redone after a crash must not reuse a name vLLM may have served
        version = f"step-{step}-{os.urandom(3).hex()}"
        if state.tenant is not None:
            version = f"{state.tenant}-{version}"  # vLLM serves every tenant's side by side
        target = state.checkpoints / version
        if target.exists():
            # left by a run that died before recording this step: the database, not the
            # directory, says what was published, so the half-done attempt is redone
            shutil.rmtree(target)
        return version, target

    def _record_failed(
        self,
        step: int,
        version: str,
        target: Path,
        result: PublishResult,
        metrics: JsonObject,
        considered: list[str],
        baselines: Baselines,
    ) -> None:
        """A version that failed verification: recorded rolled back, its step and batch
        consumed; the trainer goes back to the serving weights."""
        state, lineage = self.state, self.state.lineage
        assert lineage.serving is not None
        parent = lineage.serving["version"]
        metrics.update(_swap_metrics(result))
        with state.engine.begin() as conn:
            # no ordinal: it never served anyone, nothing it did is trainable
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=None,
                parent=parent,
                checkpoint_path=str(target),
                status="rolled_back",
                swap_seconds=result.swap_seconds,
                error=result.error,
                metrics=metrics,
                tenant=state.tenant,
            )
            self._record_step(conn, step, None, metrics, considered, baselines)
        state.step, lineage.baselines = step, baselines
        log.error("version %s failed (%s); %s keeps serving", version, result.error, parent)
        self.weights.reload()
        lineage.needs_restore = not result.restored
        self._prune()

    def _publish(
        self,
        checkpoint: Path,
        version: str,
        record: Any,
        tensors: dict[str, torch.Tensor] | None,
        write: AdapterWrite | None = None,
        canary: CanarySettings | None = None,
    ) -> PublishResult:
        """`canary`: the version is a canary's candidate, loaded and verified beside what
        serves (an adapter, or full weights on some of the replicas), which it does not
        replace."""
        lineage = self.state.lineage
        assert lineage.trainer is not None and lineage.publisher is not None
        if write is not None:
            assert isinstance(lineage.publisher, LoraPublisher)
            return lineage.publisher.publish(
                checkpoint,
                version,
                expected=lineage.trainer.logprobs_of,
                commit=record,
                write=write,
                serve=canary is None,
            )
        if tensors is None and canary is None:
            return lineage.publisher.publish(
                checkpoint, version, expected=lineage.trainer.logprobs_of, commit=record
            )
        assert isinstance(lineage.publisher, FullWeightPublisher)
        on = (
            None
            if canary is None
            else candidate_replicas(lineage.publisher.upstreams, canary.share)
        )
        return lineage.publisher.publish(
            checkpoint,
            version,
            expected=lineage.trainer.logprobs_of,
            commit=record,
            tensors=tensors,
            on=on,
        )

    def withdraw_candidate(self) -> None:
        """A decided canary's full-weight candidate: its replicas serve what the others do
        again, verified, under the publish lease, unless what serves changed meanwhile (a
        swap that held the lease served every replica: the loop follows it); where that
        fails, every replica is restored (the loop's restore)."""
        state, lineage = self.state, self.state.lineage
        publisher = lineage.publisher
        if not isinstance(publisher, FullWeightPublisher) or not publisher.canary_replicas:
            return
        assert lineage.serving is not None
        replicas = ", ".join(publisher.canary_replicas)
        state.activity = f"serving {lineage.serving['version']} again on {replicas}"
        with lease.held(state.engine, state.holder, wait=LEASE_WAIT), state.stopping.swap():
            with state.engine.connect() as conn:
                serving = policy_versions.serving_name(conn, state.tenant)
            if serving != lineage.serving["version"]:
                return  # the next look follows it (Weights.follow), candidate replicas too
            result = publisher.withdraw(lineage.serving["version"])
        if result.ok and result.opened:
            log.info("%s serves %s again", replicas, lineage.serving["version"])
            return
        log.error(
            "could not serve %s again on %s (%s): every replica is restored",
            lineage.serving["version"],
            replicas,
            result.error,
        )
        lineage.needs_restore = True

    def served_tensors(self) -> dict[str, torch.Tensor]:
        """The weights the replicas are to serve, by checkpoint name: the trainer's own
        tensors, uncopied where no cast is needed (nothing trains while they publish)."""
        trainer = self.state.lineage.trainer
        assert trainer is not None
        return checkpoint_tensors(trainer.model, state=trainer.checkpoint_state(), copy=False)

    def adapter_publisher(self) -> bool:
        """Whether the lineage publishes adapters (--lora): its publisher writes them."""
        return self.state.config.lora and isinstance(self.state.lineage.publisher, LoraPublisher)

    def file_transport(self) -> WeightFileTransfer | None:
        """The publisher's transport where it sends the trainer's tensors from memory
        (swap/transfer.py); None where the replicas load from the disk."""
        lineage = self.state.lineage
        if isinstance(lineage.publisher, FullWeightPublisher):
            transport = lineage.publisher.transport
            return transport if isinstance(transport, WeightFileTransfer) else None
        return None

    def _transfer_metrics(self) -> TransferMetrics:
        transport = self.file_transport()
        if transport is None:
            return {}
        writes = [p.write for p in transport.last_phases.values()]
        if not writes:
            return {}
        return {
            "transfer_bytes": sum(w.bytes_sent for w in writes),
            "transfer_full_syncs": sum(w.full for w in writes),
            "transfer_write_seconds": round(sum(w.seconds for w in writes), 3),
            "transfer_changed_share": round(
                sum(w.changed for w in writes) / max(sum(w.elements for w in writes), 1), 6
            ),
        }

    def _save_checkpoint_files(self, step: int, target: Path, metrics: JsonObject) -> None:
        """The checkpoint, and every --optimizer-state-every steps the optimizer state."""
        saving = time.monotonic()
        checkpoint = self.save(target)
        metrics["save_seconds"] = round(time.monotonic() - saving, 3)
        self._save_optimizer_state(step, checkpoint, metrics)

    def _save_optimizer_state(self, step: int, checkpoint: Path, metrics: JsonObject) -> None:
        """Every --optimizer-state-every steps, the optimizer state beside the checkpoint."""
        saving = time.monotonic()
        every = self.state.config.optimizer_state_every
        if every > 0 and step % every == 0:
            self.weights.save_optimizer(checkpoint)
        metrics["optimizer_state_seconds"] = round(time.monotonic() - saving, 3)

    def _adapter_writer(self, metrics: JsonObject) -> AdapterWrite:
        """Fills an empty directory with the lineage's adapter, as `save` writes it; the
        time it took is the step's save_seconds (into memory, where it goes there)."""

        trainer, base_dir = self.state.lineage.trainer, self._adapter_base()
        assert trainer is not None

        def write(directory: Path) -> None:
            saving = time.monotonic()
            write_adapter(trainer.served_model, directory, base_dir=base_dir)  # type: ignore[arg-type]
            metrics["save_seconds"] = round(time.monotonic() - saving, 3)

        return write

    def _prune(self) -> None:
        """Checkpoint retention, under the publish lease the caller holds."""
        state = self.state
        try:
            retention.prune(
                state.engine,
                checkpoints=state.checkpoints,
                keep_last=state.config.keep_checkpoints,
                upstreams=state.config.upstreams,
            )
        except OSError as exc:
            log.warning("checkpoint retention failed (tried again next step): %s", exc)
        if state.adapter_memory is not None:
            # the memory copies of the adapters the replicas no longer list
            orphan_adapters.sweep_memory_copies(state.adapter_memory, state.config.upstreams)

    def _record_step(
        self,
        conn: Any,
        step: int,
        version: str | None,
        metrics: JsonObject,
        considered: list[str],
        baselines: Baselines,
    ) -> None:
        training_steps.add_step(
            conn, step=step, version=version, metrics=metrics, tenant=self.state.tenant
        )
        grade_queue.mark_trained(conn, trajectory_ids=considered, step=step)
        save_baselines(conn, baselines, self.state.tenant)

    def publisher_for(self, source: Path) -> WeightPublisher:
        """The lineage's publisher, its last good version the one that serves (`source`)."""
        state, serving, config = self.state, self.state.lineage.serving, self.state.config
        assert serving is not None
        # what the replicas hold besides any adapter: the full checkpoint under it
        base = served_base(source)
        settings: PublisherSettings = {
            "probe": state.probe,
            "tolerance": state.tolerance,
            "last_good": base,
            "last_good_fingerprint": Fingerprint.from_state(
                serving["probe"], at_least=state.tolerance
            ),
            "last_good_label": serving["version"],
            "fence": state.fence,
            "check_weights": state.weights_checked,
            # a configured tolerance is kept as it is
            "checked_probe_tolerance": None
            if config.verify_tolerance is not None
            else HALF_PRECISION_CHECKED_TOLERANCE,
        }
        if not config.lora:
            if state.transport == "transfer":
                return transfer_publisher(config.upstreams, delta=config.transfer_delta, **settings)
            return FullWeightPublisher(config.upstreams, **settings)
        tenant = state.tenant
        return LoraPublisher(
            config.upstreams,
            max_rank=config.lora_rank,
            keep=self._adapters_kept(canary=False),  # _canary sets it at each publish
            # a tenant's version serves its calls by the tenant's pointer, not as the
            # replicas' weight version (learner/loop/tenants.py)
            label=None if tenant is None else tenant_pointer(state.engine, tenant),
            # the window covers the lineage's adapters an earlier learner or a rollback loaded
            lineage=self._lineage_newest_first(tenant),
            # vLLM loads the adapters' memory copies (--lora-load-from; None: the disk's)
            memory=state.adapter_memory,
            **settings,
        )

    def _lineage_newest_first(self, tenant: str | None) -> Callable[[], list[str]]:
        def newest_first() -> list[str]:
            """What serves first: canaries rolled back are newer, and must not push it out
            of the adapters kept loaded."""
            with self.state.engine.connect() as conn:
                found = policy_versions.lineage_newest_first(conn, tenant)
                serving = policy_versions.serving_name(conn, tenant)
            return [v for v in found if v == serving] + [v for v in found if v != serving]

        return newest_first

    def save(self, target: Path) -> Path:
        """The lineage's trainer's weights as a checkpoint vLLM loads: full, or an adapter."""
        trainer, serving = self.state.lineage.trainer, self.state.lineage.serving
        assert trainer is not None and serving is not None
        if self.state.config.lora:
            # the adapter vLLM is to serve: under bf16 the copy the trainer scores with (its
            # float32 masters go beside, in the training state)
            return save_adapter(trainer.served_model, target, base_dir=self._adapter_base())  # type: ignore[arg-type]
        return save_checkpoint(
            trainer.model,
            target,
            source_dir=self.state.model_dir,
            state=trainer.checkpoint_state(),
        )

    def _adapter_base(self) -> Path:
        """The full checkpoint under the lineage's adapters: the serving version's."""
        serving = self.state.lineage.serving
        assert serving is not None
        return served_base(Path(serving["checkpoint_path"]))


def _swap_metrics(result: PublishResult) -> SwapMetrics:
    """What the swap's verification measured, for the version's and the step's records."""
    return {
        "swap_seconds": result.swap_seconds,
        "max_logprob_diff": result.max_logprob_diff,
        "weight_sums_compared": result.weight_sums_compared,
    }
