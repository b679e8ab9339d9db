"""The engines a policy runs: the pool set, built at start and reconciled on every reload (`pool_change` plans,
`version_change` starts a new version blue-green or rolling, `canary_set` and `canaries` run and guard
canaries, `replica_scaling` and `autoscale` add and remove replicas, `draining` retires what leaves), and
on-demand pools woken by the request that needs them (`on_demand`, `on_demand_shared` under `--workers`).
Imports no other sub-package of `gateway.control`."""
