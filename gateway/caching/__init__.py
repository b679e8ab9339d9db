"""The response cache: answers kept in Redis per tenant (policy `tenants.<name>.cache`, `policies.cache`) and served
again at no engine cost. `answer_cache` is the request path's lookup and keep; `keys` says what is eligible and how
it is keyed; `entry` is the stored answer; `vectors` the semantic mode's rows and scan; `store` the Redis side;
`replies` a hit as JSON or SSE."""
