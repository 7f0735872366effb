"""Each step's metrics to the experiment trackers ML teams already use (`--report-to`).

TensorBoard writes event files under `--report-dir`; W&B runs offline there unless the
environment's WANDB_MODE says otherwise (nothing leaves the machine by default); MLflow uses a
local SQLite store there (mlflow.db), unless MLFLOW_TRACKING_URI names another. Each tracker
gets the run's settings once (the database URL without its password) and one line per step:
the learner's numeric metrics, flattened ("dropped/stale"), and the guard's verdict per type.

A tracker that fails never stops the learner: it is switched off and says so once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from sqlalchemy.engine import make_url

from store.environment import environment
from store.json_types import JsonValue

if TYPE_CHECKING:
    from learner.guard import VerdictState

log = logging.getLogger("onthejob.learner")

# a setting as a tracker stores it (`run_config`): the learner's settings are numbers, flags,
# text, paths and lists of text (those two as text)
RunSetting = str | int | float | bool | None


class GuardReport(TypedDict):
    """The guard's decision on a version, as `Reporter.guard` hears it."""

    outcome: str  # kept | rolled_back | waived
    types: list[VerdictState]


class Tracker(Protocol):
    name: str

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def flatten(metrics: Mapping[str, JsonValue], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics dict as `a/b` keys; booleans as 0/1; NaN, text and lists
    (the drop reasons come as their counts: `dropped/<reason>`) left out."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            out[name] = float(value)
        elif isinstance(value, int | float):
            if math.isfinite(value):
                out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(flatten(value, f"{name}/"))
        elif key == "dropped" and isinstance(value, list):
            for drop in value:
                if isinstance(drop, Mapping) and "reason" in drop and "count" in drop:
                    out[f"{name}/{drop['reason']}"] = float(drop["count"])
    return out


def run_config(config: Mapping[str, Any]) -> dict[str, RunSetting]:
    """The settings as a tracker stores them: plain values, no password."""
    out: dict[str, RunSetting] = {}
    for key, value in config.items():
        if key == "database_url" and isinstance(value, str):
            value = make_url(value).render_as_string(hide_password=True)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, list | tuple):
            value = ",".join(str(v) for v in value)
        out[key] = value
    return out


class TensorBoard:
    name = "tensorboard"

    def __init__(self, directory: Path, run: str, config: Mapping[str, RunSetting]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory / "tensorboard" / run))
        table = "\n".join(f"| {k} | {v} |" for k, v in config.items())
        self.writer.add_text("config", "| setting | value |\n|---|---|\n" + table, 0)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    name = "wandb"

    def __init__(self, directory: Path, run: str, config: Mapping[str, RunSetting]) -> None:
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=environment().wandb_project,
            name=run,
            dir=str(directory),
            config=dict(config),
            mode=environment().wandb_mode,  # type: ignore[arg-type]
            reinit="create_new",
            # the learner's own output stays the learner's: W&B does not wrap stdout/stderr
            settings=wandb.Settings(console="off"),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflow:
    name = "mlflow"

    def __init__(self, directory: Path, run: str, config: Mapping[str, RunSetting]) -> None:
        from mlflow.tracking import MlflowClient

        # a local SQLite file: MLflow's plain-file store is frozen and refused by default
        directory.mkdir(parents=True, exist_ok=True)
        local = f"sqlite:///{(directory / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=environment().mlflow_tracking_uri or local)
        experiment = self.client.get_experiment_by_name("onthejob")
        experiment_id = (
            self.client.create_experiment("onthejob")
            if experiment is None
            else experiment.experiment_id
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run).info.run_id
        for key, value in config.items():
            self.client.log_param(self.run_id, key, str(value)[:6000])

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _slug(name: str) -> str:
    """A detector's name as a metric key: "reward up, complaints up" -> reward_up_complaints_up."""
    return "_".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def _mlflow_key(key: str) -> str:
    # MLflow takes letters, digits, _ - . space : / only
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in key)


OPENERS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class Reporter:
    """The trackers of one learner run; every call is safe whatever a tracker does."""

    def __init__(
        self, names: Iterable[str], directory: Path, run: str, config: Mapping[str, Any]
    ) -> None:
        self.trackers: list[Any] = []
        settings = run_config(config)
        for name in names:
            try:
                self.trackers.append(OPENERS[name](directory, run, settings))
                log.info("reporting each step to %s (%s)", name, directory)
            except Exception as exc:  # a tracker never stops the learner
                log.warning(
                    "--report-to %s is off: it could not start (%s: %s)%s",
                    name,
                    type(exc).__name__,
                    exc,
                    " (pip install 'onthejob[trackers]')" if isinstance(exc, ImportError) else "",
                )

    def step(self, step: int, metrics: Mapping[str, JsonValue]) -> None:
        self._each(lambda t: t.log(step, flatten(metrics)))

    def guard(self, step: int, decision: GuardReport) -> None:
        """The guard's verdict: kept (1) or rolled back (0), and each type's before/after."""
        values = {"guard/kept": float(decision.get("outcome") != "rolled_back")}
        for kind in decision.get("types") or []:
            name = kind.get("type", "?")
            for side in ("before", "after"):
                figure = kind.get(side) or {}
                if isinstance(figure.get("value"), int | float):
                    values[f"guard/{name}/{side}"] = float(figure["value"])
            values[f"guard/{name}/regressed"] = float(bool(kind.get("regressed")))
        self._each(lambda t: t.log(step, values))

    def watch(self, step: int, active: Mapping[str, int], held: Mapping[int, bool]) -> None:
        """The reward-hacking watch after a look that changed it: how many alerts each
        detector has now (`watch/<detector>`), and each canary it holds or let go
        (`watch/held/<canary id>`: 1 or 0)."""
        values = {f"watch/{_slug(detector)}": float(n) for detector, n in active.items()}
        values |= {f"watch/held/{canary}": float(on) for canary, on in held.items()}
        self._each(lambda t: t.log(step, values))

    def close(self) -> None:
        self._each(lambda t: t.close())
        self.trackers = []

    def _each(self, call: Any) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # a tracker never stops the learner: off, said once
                self.trackers.remove(tracker)
                log.warning(
                    "--report-to %s failed and is off for this run: %s: %s",
                    tracker.name,
                    type(exc).__name__,
                    exc,
                )
