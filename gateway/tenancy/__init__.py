"""Per-tenant limits, budgets and admission."""
