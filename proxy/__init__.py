"""onthejob proxy: OpenAI-compatible front of vLLM that records every call token-exact."""
