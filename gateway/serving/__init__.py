"""One request's path: the request schema, the request's context, its route steps (`steps`), the sending layers
(`layers`: cache, output check, failover, canary, cascade, dispatch), forwarding and the proxy, the SSE relay, usage
and accounting."""
