"""A vLLM-CPU fix, installed by our vLLM plugin (learner/swap/vllm_plugin.py): an idle
replica keeps a core busy for a second after every request.

vLLM's processes read their work from a shared-memory queue. After each read a reader
spins on the queue, yielding the core between looks (`sched_yield`), for `busy_loop_s`
(1 s, not configurable) before it waits on a socket instead. On a GPU machine that second
is cheap. On a CPU machine where the learner computes beside vLLM, it is a core taken
from the trainer after every request: a SmolLM2 forward pass on the publish's probe took
1.13 s right after the previous publish's verification request, against 0.11 s with vLLM
idle (bench/tenant_scale.py, 2 cores): torch's threads wait on each other while one of
them has lost its core to the spinning reader.

On CPUs the readers spin for `SPIN_S` instead (ONTHEJOB_VLLM_SPIN_S lowers it; vLLM's
own second stays the most): longer than a decoding step, so a busy replica decodes as
before, and an idle one gives its cores back a tenth of a second after its last request. A
reader that waits longer sleeps on the socket and is woken by the notification the writer
sends with every message anyway. vLLM's optional spin extension (VLLM_USE_SPINLOOP_EXT, off
by default) spins apart from this and is not shortened.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("onthejob.vllm_plugin")

PATCHED = "_onthejob_idle_spin_fix"
# seconds a reader spins after a read (vLLM's own: 1.0). Longer than a decoding step, so a
# busy replica's readers never sleep: SmolLM2 decoded 195 and 186 tokens/s for 8 clients at
# 0.1 s against 185 and 185 at 1 s, but 177 and 146 at 0.02 s (2 cores, Intel Xeon)
SPIN_S = 0.1
ENV = "ONTHEJOB_VLLM_SPIN_S"


def spin_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """SPIN_S, or the environment's non-negative number of seconds."""
    text = environ.get(ENV)
    if text is None:
        return SPIN_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        log.warning("%s=%r is not a number of seconds >= 0: using %g", ENV, text, SPIN_S)
        return SPIN_S
    return value


def install() -> None:
    """Shorten the readers' spin (on CPU platforms only)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.distributed.device_communicators import shm_broadcast

    condition = shm_broadcast.SpinCondition
    if getattr(condition.__init__, PATCHED, False):
        return
    original = condition.__init__
    seconds = spin_seconds()

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.is_reader:
            self.busy_loop_s = min(self.busy_loop_s, seconds)

    setattr(init, PATCHED, True)
    condition.__init__ = init
