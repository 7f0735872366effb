"""The vLLM replicas behind the proxy: which one answers, their health and policy version,
the HTTP/1.1 client that reaches them, and the swap gates that keep calls off a replica while
its weights change."""
