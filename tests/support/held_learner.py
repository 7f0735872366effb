"""`onthejob learn` that holds for ever at a moment a fault drill kills the process in:

    python -m tests.support.held_learner MARKER learn ...            the first optimizer step, once
                                                             the weights have moved and before
                                                             anything records the step
    python -m tests.support.held_learner --publish MARKER learn ...  step 1's publish, once its
                                                             replicas are fenced off and
                                                             drained, before the swap
    python -m tests.support.held_learner --publish-until-signal MARKER learn ...
                                                             the same, until the first
                                                             signal it handles: the swap
                                                             then goes on

MARKER is written (with the process id) when it holds.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from cli import main as cli
from learner.swap.full_publisher import FullWeightPublisher
from learner.trainer import Trainer


def hold_first_step(marker: Path) -> None:
    step = Trainer.step

    def held(trainer: Trainer, samples: Any, advantages: Any, **kwargs: Any) -> dict[str, Any]:
        step(trainer, samples, advantages, **kwargs)
        marker.write_text(str(os.getpid()))
        while True:  # until the drill's SIGKILL
            signal.pause()

    Trainer.step = held  # type: ignore[method-assign]


def hold_first_publish(marker: Path, *, until_signal: bool = False) -> None:
    swap_all = FullWeightPublisher._swap_all

    def held(
        publisher: FullWeightPublisher, client: Any, directory: Any, result: Any, *rest: Any
    ) -> None:
        if result.version.startswith("step-1-"):
            marker.write_text(str(os.getpid()))
            signal.pause()  # returns once a handler ran: the learner's, for SIGTERM
            while not until_signal:  # until the drill's SIGKILL
                signal.pause()
        swap_all(publisher, client, directory, result, *rest)

    FullWeightPublisher._swap_all = held  # type: ignore[method-assign]


if __name__ == "__main__":
    if sys.argv[1] in ("--publish", "--publish-until-signal"):
        hold_first_publish(Path(sys.argv[2]), until_signal=sys.argv[1] != "--publish")
        sys.exit(cli.main(sys.argv[3:]))
    hold_first_step(Path(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
