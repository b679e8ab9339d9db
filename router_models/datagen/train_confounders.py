"""Training prompts that break the "long = hard" shortcut: long prompts with light asks (label 0) and terse
prompts that need real work (label 1). Without them a router learns prompt length, which real traffic
(pasted documents, one-line olympiad problems) punishes."""

from __future__ import annotations

import random

from router_models.datagen.common import Example, expand
from router_models.datagen.train_light import NAMES, PASSAGES

__all__ = ["confounder_examples"]

C = random.Random.choice

CODE_BLOCK = '''```python
def load_orders(path):
    orders = []
    with open(path) as fh:
        for line in fh:
            parts = line.strip().split(",")
            if len(parts) < 3:
                continue
            orders.append({"id": parts[0], "customer": parts[1], "total": float(parts[2])})
    return orders


def big_orders(orders, limit=100):
    result = []
    for o in orders:
        if o["total"] > limit:
            result.append(o)
    return result
```'''
LIGHT_CODE_ASKS = ["Add docstrings to these functions.", "Rename `o` to `order` everywhere.",
                   "What does big_orders return?", "Convert the loop in big_orders to a list comprehension.",
                   "Add type hints.", "Is there a syntax error here?", "Format this with black style."]
LIGHT_DOC_ASKS = ["Summarize this in two sentences.", "List the names and dates mentioned.",
                  "Translate the first paragraph to Spanish.", "Give it a title.",
                  "Extract every number with what it refers to, as a JSON list.",
                  "Fix any typos and return the text.", "Which paragraph mentions a delay?"]
TERSE_HARD = [
    "Is 2^61 - 1 prime? Prove it.", "Prove sqrt(2) + sqrt(3) is irrational.", "Solve x^x = 2 exactly.",
    "Lock-free skiplist in C++, with memory reclamation.", "Why is P vs NP hard to resolve? Be precise.",
    "Derive the Black-Scholes PDE.", "Prove the halting problem is undecidable.",
    "Write a regex engine with backtracking in C.", "Implement Paxos.", "Monty Hall with 5 doors, 2 opened?",
    "Count labelled trees on n vertices; prove it.", "Is sum 1/p over primes divergent? Prove.",
    "Fix: my Rust async code deadlocks on a Mutex across .await.", "Design Google Docs' sync engine.",
    "Should we shard or add read replicas? 40k QPS, 80% reads.", "Best response to a hostile takeover bid?",
    "Prove every planar graph is 5-colourable.", "Minimise x^4 - 3x^3 + 2 over the reals, rigorously.",
    "Write a JIT for Brainfuck in Rust.", "Explain the CAP theorem's proof, not the slogan.",
    "Expected max of n uniforms? Derive.", "Ethics of triage in a pandemic ICU, your view?",
    "Convert this recursive descent parser to Pratt parsing.", "Prove Fermat's little theorem two ways.",
]


def _long_light(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return f"{CODE_BLOCK}\n\n{C(rng, LIGHT_CODE_ASKS)}"
    docs = "\n\n".join(rng.sample(PASSAGES, rng.randint(3, 5)))
    if kind < 0.8:
        return f"{docs}\n\n{C(rng, LIGHT_DOC_ASKS)}"
    name = C(rng, NAMES).split()[0]
    return (f"Hi! So today was a long day. I woke up late, missed the bus, and {name} had to drive me to "
            "work. Then the coffee machine was broken, my laptop needed an update, and lunch was cold. "
            "In the evening I finally watched a movie with my cat on my lap, which was nice. Anyway, "
            f"{C(rng, ['any tips to relax before bed?', 'can you say something cheerful?', 'how was yours?'])}")


def _terse_hard(rng: random.Random) -> str:
    return C(rng, TERSE_HARD)


def confounder_examples(rng: random.Random) -> list[Example]:
    """About 100 long-but-light (label 0) and 24 terse-but-hard (label 1) examples."""
    return [
        *expand(rng, [_long_light], 100, 0, "long_light"),
        *expand(rng, [_terse_hard], 24, 1, "terse_hard"),
    ]
