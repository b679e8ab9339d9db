"""Learning from the gateway's own traffic: feedback, shadow comparisons, the judge, their store."""
