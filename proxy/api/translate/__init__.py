"""Pure translations between the client-facing APIs and upstream chat completions."""
