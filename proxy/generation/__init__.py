"""One generation call from the client's request to the answer: token capture, fan-out,
effective sampling, prompt token counts, stream re-emission."""
