"""The OpenAI surface of a request: the three endpoints and what differs between them (`endpoints`), their
request schemas parsed into the chat path's view (`schema`, `responses_schema`, `completions_schema`), the
engine's request body (`upstream`), and token usage, reported by the engine or counted (`usage`,
`prompt_count`). Imports no other sub-package of `gateway.serving`."""
