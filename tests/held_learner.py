"""`onthejob learn` whose first optimizer step holds for ever, once the weights have moved
and before anything records the step: a fault drill kills the process there.

    python -m tests.held_learner MARKER learn ...

MARKER is written (with the process id) when the step holds.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from learner.trainer import Trainer
from proxy import cli


def hold_first_step(marker: Path) -> None:
    step = Trainer.step

    def held(trainer: Trainer, samples: Any, advantages: Any, **kwargs: Any) -> dict[str, Any]:
        step(trainer, samples, advantages, **kwargs)
        marker.write_text(str(os.getpid()))
        while True:  # until the drill's SIGKILL
            signal.pause()

    Trainer.step = held  # type: ignore[method-assign]


if __name__ == "__main__":
    hold_first_step(Path(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
