"""One request's path: the request schema, routing decision, forwarding, proxy and failover, the cascade, the SSE
relay, usage and accounting."""
