"""The cost ledger: records, keys, the Redis store and its on-disk outbox."""
