"""A planned request sent to its pool: the sending layers, each wrapping the next (`layers`: cache, output
check in `answer_check`, failover, canary, the cascade in `cascade_flow`, dispatch) over engine calls
(`calls`); below them the proxy with failover before the first byte (`proxy`), forwarding of JSON and streams
(`forwarding`, `assemble`), the SSE relay (`streaming`), the Responses API over a chat-only pool
(`responses_chat`, `responses_via_chat`). May import `gateway.serving.openai`, `gateway.serving.routing` and
`gateway.serving.records`."""
