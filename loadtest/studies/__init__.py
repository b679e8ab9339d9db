"""One-off studies whose conclusions live in BENCHMARKS.md and router_models/MODEL_CARD.md, kept runnable to
reproduce their figures: an encoder fine-tuned against the frozen one (`finetune_scorer`, `finetune_loso`,
over `finetune`), the router's learning curve on a user's own labels (`learning_curve`, over
`learning_curve_fits`), the semantic cache's false hits (`cache_similarity`). Nothing else imports them."""
