"""The serving side: the scorer contract, the classifier head, artifacts and their store, the micro-batched scorer."""
