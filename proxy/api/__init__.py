"""The client-facing edge: routes per API (OpenAI chat and completions, Responses, Anthropic
Messages, feedback), their translation onto chat completions, request checks, client keys and
the error shapes."""
