"""Where a request goes: the router (shed check, score, policy decision), the frozen context every step and
layer reads (`request_context`), the tiers' quality and cost (`tier_trade`, `placements`), tenants' label
memories and drift (with `drift_sync` across processes), the router swapped while serving (`router_swap`),
context fit and the completion limit, the engine version a request takes (`versions`). May import
`gateway.serving.openai`."""
