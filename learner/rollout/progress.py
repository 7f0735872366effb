"""The rollout's progress bar: runs done of total, running, failed, running mean reward."""

from __future__ import annotations

from tqdm import tqdm

from learner.rollout.runner import Progress


class ProgressBar:
    def __init__(self, label: str, *, disable: bool = False) -> None:
        self.label = label
        self.disable = disable
        self.bar: tqdm | None = None

    def update(self, progress: Progress) -> None:
        if self.bar is None:
            self.bar = tqdm(total=progress.total, desc=self.label, unit="run", disable=self.disable)
        self.bar.n = progress.done
        reward = "-" if progress.mean_reward is None else f"{progress.mean_reward:.3f}"
        self.bar.set_postfix(
            running=progress.running, failed=progress.failed, reward=reward, refresh=False
        )
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
