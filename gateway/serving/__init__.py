"""One request's path, by concern: `openai` (the endpoints and their capabilities, request schemas, the engine
body, usage), `routing` (where it goes, the request's frozen context), `records` (accounting, access and
replay logs, traces), `sending` (the sending layers: cache, output check, failover, canary, cascade,
dispatch; the proxy, forwarding, the SSE relay). At the top, what composes them: `service` (screen, plan,
send), `steps` (the route steps, run in one loop) and `serving_parts` (the collaborators they share). The
sub-packages import each other only downwards, in that order (`tests/test_layers.py`)."""
