"""`onthejob learn` on several devices: ranks launched by torchrun, FSDP2 sharding.

Run as ``torchrun --nproc-per-node N -m cli learn ...`` (or ``torchrun
--nproc-per-node N --no-python onthejob learn ...``). Rank 0 is the learner: it grades,
groups, talks to the database, checkpoints and publishes, as a single-process learner does.
Every rank holds a shard of the parameters, gradients and AdamW state
(`torch.distributed.fsdp.fully_shard` on each decoder layer and on the rest of the model);
ranks other than 0 only follow rank 0's commands: build a trainer from a checkpoint, take a
step on a batch, score the probe, gather the weights. A command is broadcast over a gloo
group of its own (`broadcast_object_list`), so the ranks wait for one while rank 0 waits for
traffic, then every rank makes the same call, whose collectives (FSDP's all-gathers and
reduce-scatters on the default group: gloo on CPU, NCCL on GPU) they meet in the same order.

Invariant: every rank runs the same forward and backward passes in the same order. A step's
batch goes to every rank; each computes its share of its micro-batches (round robin over the
same longest-first list) and, where its share is one short, a pass whose loss counts zero.
Gradients are summed over the ranks, not averaged: the loss is already normalised by the
step's global count of trained tokens. Checkpoints are gathered to rank 0
(`get_model_state_dict(full_state_dict=True, cpu_offload=True)`) and written as a
single-process learner writes them, in the layout vLLM loads.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.optim.optimizer import StateDict

from learner.trainer import (
    TRAINING_STATE_FORMAT,
    MicroBatch,
    Trainer,
    TrainerConfig,
    TrainingState,
    checkpoint_layers,
    micro_batches,
)
from store.environment import environment
from store.json_types import JsonObject
from store.samples import Sample

log = logging.getLogger("onthejob.learner")

# Ranks other than 0 wait this long for rank 0's next command (a rank 0 that died ends their
# wait at once: the connection closes); rank 0 sends a no-op at least every KEEPALIVE
# seconds of its loop, however long it waits for traffic.
COMMAND_TIMEOUT = timedelta(days=1)
CLOSE_TIMEOUT = timedelta(seconds=60)
KEEPALIVE = 600.0
# The calls rank 0 makes that every rank must make with it (they hold collectives).
COLLECTIVE = frozenset(
    {
        "step",
        "logprobs_of",
        "checkpoint_state",
        "training_state",
        "load_training_state",
        "set_learning_rate",
    }
)


def launched() -> bool:
    """Whether this process is one of several ranks torchrun started."""
    return environment().world_size > 1


class Ranks:
    """This process's place among the ranks, and the channel rank 0 commands them by."""

    def __init__(self) -> None:
        cuda = torch.cuda.is_available()
        if cuda:
            local = environment().local_rank
            torch.cuda.set_device(local)
            self.device = f"cuda:{local}"
        else:
            self.device = "cpu"
        if not dist.is_initialized():
            dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.mesh = init_device_mesh("cuda" if cuda else "cpu", (self.world,))
        self.control = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
        self._sent = time.monotonic()

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def share(self, value: Any = None) -> Any:
        """Rank 0's `value`, on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=self.control)
        return out

    def command(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Rank 0: have the other ranks make this call."""
        self._sent = time.monotonic()
        self.share((name, args, kwargs))

    def keepalive(self) -> None:
        """Rank 0, while idle: a no-op now and then, so no rank's wait times out."""
        if time.monotonic() - self._sent > KEEPALIVE:
            self.command("noop")

    def build(
        self, source: Path, config: TrainerConfig, reference: Path | None = None
    ) -> Coordinated:
        """Rank 0: every rank builds a sharded trainer from the checkpoint `source`."""
        self.command("build", source, config, reference)
        return Coordinated(self, build_trainer(self, source, config, reference))

    def serve(self) -> int:
        """Ranks other than 0: follow rank 0's commands until it says stop."""
        trainer: ShardedTrainer | None = None
        while True:
            name, args, kwargs = self.share()
            if name == "stop":
                self._close()
                return 0
            if name == "noop":
                continue
            if name == "build":
                trainer = None  # the old shards go before the new ones come
                trainer = build_trainer(self, *args, **kwargs)
                continue
            assert trainer is not None, f"{name} before any build"
            try:
                getattr(trainer, name)(*args, **kwargs)
            except ValueError:
                if name != "load_training_state":
                    raise
                # rank 0 met the same (its state does not fit) and starts the moments afresh

    def stop(self) -> None:
        """Rank 0, at the end: the other ranks return from `serve`."""
        try:
            self.command("stop")
        finally:
            self._close()

    def _close(self) -> None:
        """Every rank, together: no rank tears its groups down while another still talks
        on them (rank 0 alone destroying them right after `stop` aborted it now and then:
        `terminate called without an active exception`)."""
        try:  # bounded: a rank that hangs must not hold the others' exit for a day
            dist.monitored_barrier(group=self.control, timeout=CLOSE_TIMEOUT)
        finally:
            dist.destroy_process_group()


def end_rank(code: int) -> NoReturn:
    """A rank's last act, once `Ranks.stop` or `serve` has torn its groups down and all its
    work is done: exit without the interpreter's finalization. Finalization frees what
    torch's native threads may still reference, and needing the interpreter lock then
    aborted rank 0 now and then after a clean run (SIGABRT, `terminate called without an
    active exception`), failing a run that had finished its work."""
    logging.shutdown()  # the log's last lines
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Coordinated:
    """Rank 0's trainer: each collective call is first sent to the other ranks, which make
    it on their shards, then made here. Anything else is this rank's trainer's own."""

    def __init__(self, ranks: Ranks, trainer: ShardedTrainer) -> None:
        self.ranks = ranks
        self.local = trainer

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.local, name)
        if name not in COLLECTIVE:
            return value

        def collective(*args: Any, **kwargs: Any) -> Any:
            # the other ranks receive their part of a training state by broadcast
            sent = (None,) if name == "load_training_state" else args
            self.ranks.command(name, *sent, **kwargs)
            return value(*args, **kwargs)

        return collective


def build_trainer(
    ranks: Ranks, source: Path, config: TrainerConfig, reference: Path | None = None
) -> ShardedTrainer:
    """This rank's part of a trainer on the full weights in `source` (every rank reads it)."""
    from learner.checkpoint import load_model
    from learner.layout import is_adapter
    from learner.lora import load_trainable, merge

    model = merge(load_trainable(source)) if is_adapter(source) else load_model(source)
    frozen = None if reference is None else load_model(reference)
    return ShardedTrainer(model, config, ranks, frozen)


class _Root(torch.nn.Module):
    """The FSDP root: runs `work(model)` inside its forward, so that the parameters outside
    the decoder layers (embeddings, final norm, LM head) are gathered for whatever `work`
    does with the model: the trainer calls the decoder and the head separately."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, work: Callable[[torch.nn.Module], Any]) -> Any:
        return work(self.model)


def shard(model: torch.nn.Module, ranks: Ranks, precision: str) -> _Root:
    """FSDP2 over the ranks: each decoder layer a unit of its own, the rest of the model in
    the root. Under "bfloat16" the forward and backward run in bf16 on the gathered weights
    while the shards, their gradients (reduced in float32) and AdamW's state stay float32."""
    policy = MixedPrecisionPolicy()
    if precision == "bfloat16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kinds = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in kinds]
    if not layers:
        raise ValueError(f"no decoder layers ({sorted(kinds)}) to shard in the model")
    for layer in layers:
        fully_shard(layer, mesh=ranks.mesh, mp_policy=policy)
    root = _Root(model)
    fully_shard(root, mesh=ranks.mesh, mp_policy=policy)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            # summed, not averaged: each rank's loss is already over the global token count
            # (and by a plain SUM: gloo has no pre-multiplied sum)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


class ShardedTrainer(Trainer):
    """A `Trainer` whose parameters, gradients and optimizer state are sharded over the
    ranks. Every method that computes with the model is collective: all ranks call it."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig,
        ranks: Ranks,
        reference: torch.nn.Module | None = None,
    ) -> None:
        # not Trainer.__init__: the parameters are sharded before the optimizer sees them
        if config.loss.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.device, self.config, self.ranks = ranks.device, config, ranks
        # on the CPU still: fully_shard moves one unit at a time to the device, so no device
        # ever holds the whole model
        self.model = self.compute = model.to(torch.float32)
        if config.activation_checkpointing:
            checkpoint_layers(model)
        self.root = shard(model, ranks, config.precision)
        self.reference = None
        self.reference_root: _Root | None = None
        if reference is not None:
            reference = reference.to(torch.float32).eval()
            reference.requires_grad_(False)
            self.reference, self.reference_root = (
                reference,
                shard(reference, ranks, config.precision),
            )
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self._copies = []
        self._start_optimizer(config)
        self._gathered: dict[str, torch.Tensor] | None = None  # full float32, rank 0

    def _run(self, work: Callable[[torch.nn.Module], Any]) -> Any:
        return self.root(work)

    def _run_reference(self, work: Callable[[torch.nn.Module], Any]) -> Any:
        assert self.reference_root is not None
        values = self.reference_root(work)
        # FSDP keeps a root's parameters gathered after its forward, for the backward that
        # never comes to a frozen reference: without this its embeddings and LM head would
        # stay whole on every rank
        self.reference_root.reshard()
        return values

    def logprobs_of(self, prompt: list[int], completion: list[int]) -> list[float]:
        values = super().logprobs_of(prompt, completion)
        self.root.reshard()  # no backward follows that would free the gathered root
        return values

    def step(
        self,
        samples: list[Sample],
        advantages: list[float],
        *,
        fresh_version: str | None = None,
        previous_versions: Mapping[str, float] | None = None,
        previous_scale: float | None = None,
    ) -> JsonObject:
        self._gathered = None
        return super().step(
            samples,
            advantages,
            fresh_version=fresh_version,
            previous_versions=previous_versions,
            previous_scale=previous_scale,
        )

    def _micro_batches(
        self, samples: list[Sample], advantages: list[float]
    ) -> Iterator[tuple[MicroBatch, bool]]:
        """This rank's share of the step's micro-batches (the same list on every rank), and
        a pass that counts zero where the share is one short, so all run as many passes."""
        batches = list(micro_batches(samples, advantages, self.config.micro_batch_tokens))
        world, rank = self.ranks.world, self.ranks.rank
        for first in range(0, len(batches), world):
            index = first + rank
            if index < len(batches):
                yield batches[index], True
            else:
                yield batches[-1], False

    def _reduce(self, totals: dict[str, float], extremes: dict[str, float]) -> None:
        gathered = self.ranks.gather((totals, extremes))
        totals.clear()
        extremes.clear()
        for their_totals, their_extremes in gathered:
            for key, value in their_totals.items():
                totals[key] = totals.get(key, 0.0) + value
            for key, value in their_extremes.items():
                pick = min if key.endswith("_min") else max
                extremes[key] = pick(extremes.get(key, value), value)

    def _full_state(self) -> dict[str, torch.Tensor]:
        """The full float32 state dict, gathered to rank 0 (empty elsewhere); once per step."""
        if self._gathered is None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            self._gathered = get_model_state_dict(self.model, options=options)
        return self._gathered

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        dtype = self.checkpoint_dtype
        return {
            name: tensor.to(dtype) if tensor.is_floating_point() else tensor
            for name, tensor in self._full_state().items()
        }

    def master_state(self) -> dict[str, torch.Tensor]:
        trained = {name for name, p in self.model.named_parameters() if p.requires_grad}
        return {name: t for name, t in self._full_state().items() if name in trained}

    def load_training_state(self, state: TrainingState | StateDict | None) -> None:
        """Rank 0 passes the state, the others None: rank 0 checks it fits and broadcasts
        it. Raises ValueError on every rank when it does not fit."""
        verdict = self.ranks.share(self._fits(state) if self.ranks.leader else None)
        if verdict != "ok":
            raise ValueError(verdict)
        assert state is not None or not self.ranks.leader
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        # the set_* calls put their shards into the dicts they are given: not the caller's
        mine = _dicts_copied(state) if self.ranks.leader else {}
        assert isinstance(mine, dict)
        set_optimizer_state_dict(
            self.model, self.optimizer, mine.get("optimizer", {}), options=options
        )
        if self.ranks.share("master" in mine if self.ranks.leader else None):
            masters = StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=True, strict=False
            )
            set_model_state_dict(self.model, mine.get("master", {}), options=masters)
        self._gathered = None

    def _fits(self, state: TrainingState | StateDict | None) -> str:
        if state is None or state.get("format") != TRAINING_STATE_FORMAT:
            return "optimizer state saved by an older learner (by parameter index)"
        trained = {name for name, p in self.model.named_parameters() if p.requires_grad}
        saved = set(state["optimizer"].get("state", {}))
        if saved != trained:
            return f"optimizer state for other parameters ({sorted(saved ^ trained)[:3]})"
        return "ok"


def _dicts_copied(value: Any) -> Any:
    """`value` with every dict and list in it copied, the tensors in them shared."""
    if isinstance(value, dict):
        return {key: _dicts_copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_dicts_copied(item) for item in value]
    return value
