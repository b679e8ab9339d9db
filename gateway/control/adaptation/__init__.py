"""How routing adapts to live signals, one state for every process that shares a Redis: the degradation
ladder (`degradation`, fed and shared by `ladder_sync`), the live threshold of a `flagship_share` policy and
the live tradeoff of a `cost_per_1k` one, over a window of scores shared through Redis (`shared_window`).
Imports no other sub-package of `gateway.control`."""
