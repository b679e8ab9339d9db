"""Training prompts that need the flagship pool (label 1): multi-step reasoning, complex code, nuanced
decisions, hard math (multi-step word problems, proofs, olympiad-style), plus a few short-but-hard ones."""

from __future__ import annotations

import random

from router_models.datagen.common import Example, expand

__all__ = ["heavy_examples"]

C = random.Random.choice

SYSTEMS = ["payment service", "chat backend", "inventory system", "job scheduler", "recommendation engine",
           "log ingestion pipeline", "multi-tenant SaaS API", "IoT telemetry platform", "search index"]
LANGS = ["Python", "Rust", "Go", "C++", "Java", "TypeScript", "Kotlin"]
STRUCTS = ["a lock-free MPMC queue", "an LRU cache with TTL and O(1) operations", "a trie with fuzzy search",
           "a rate limiter using the token bucket algorithm shared across processes",
           "a B-tree with insert and delete", "an interval tree supporting overlap queries",
           "a consistent hashing ring with virtual nodes", "a persistent segment tree",
           "a thread pool with work stealing", "a Raft leader election module"]
BUGS = ["a race condition that only shows up under load", "a memory leak that grows 50MB per hour",
        "a deadlock between two mutexes", "intermittent timeouts after a connection pool upgrade",
        "wrong results when the input list has duplicates", "a stack overflow on deeply nested JSON"]
DECISIONS = [
    "whether to migrate our monolith to microservices with a team of 6 engineers and 9 months of runway",
    "whether I should accept a higher-paying job in another city while my partner is finishing a PhD",
    "how to split equity fairly between three co-founders who joined at different times",
    "whether our clinic should adopt an AI triage tool given liability and patient-trust concerns",
    "whether to raise prices 15% for existing customers or only for new ones",
    "whether to use Postgres or a document store for an event-sourced order system",
    "how to handle an employee who is a top performer but repeatedly dismissive of colleagues",
    "whether to refinance a mortgage now or wait, given uncertain interest rate movements",
]
PUZZLES = [
    "Five friends sit in a row. Ana is not at either end. Ben sits immediately right of Chloe. Dan is "
    "two seats left of Eve. Chloe is not next to Ana. Who sits in the middle? Explain your reasoning.",
    "A farmer must cross a river with a wolf, a goat and a cabbage; the boat carries one item. Then solve "
    "the version with two wolves and two goats where goats may never outnumber wolves on either bank.",
    "Three boxes are labelled apples, oranges and mixed, and all labels are wrong. You may draw one fruit "
    "from one box. Which box do you pick, and how do you deduce all labels? Generalise to n boxes.",
    "In a tournament of 7 teams everyone plays everyone once; wins give 3 points, draws 1. What is the "
    "minimum points that guarantees a top-2 finish? Justify carefully.",
    "If all bloops are razzies and some razzies are lazzies, can we conclude some bloops are lazzies? Then "
    "analyse 4 more syllogisms I will paste and explain each invalid step.",
]
HARD_MATH = [
    "Prove that there are infinitely many primes of the form 4k + 3.",
    "Find all positive integers n such that n^2 + 2n + 12 is a perfect square.",
    "Let a, b, c be positive reals with abc = 1. Prove that a/(b+c) + b/(c+a) + c/(a+b) >= 3/2.",
    "Evaluate the integral of x^2 * e^(-x) * sin(x) from 0 to infinity.",
    "How many ways can 10 people be seated at a round table if two particular people refuse to sit together?",
    "Prove that the sequence a_{n+1} = sqrt(2 + a_n) with a_1 = sqrt(2) converges and find its limit.",
    "Find the remainder when 3^{2024} is divided by 1000.",
    "Determine all functions f: R -> R such that f(x + y) = f(x) + f(y) + 2xy for all real x, y.",
    "A random chord is drawn in a circle. Discuss why the probability it is longer than the side of the "
    "inscribed equilateral triangle depends on the method, and compute it for three methods.",
    "Show that every group of order p^2 (p prime) is abelian.",
    "Compute the eigenvalues of the n x n matrix with 2 on the diagonal and -1 on the off-diagonals.",
    "Find the expected number of coin flips until you see HTH, and derive it with a Markov chain.",
    "Let P(x) be a polynomial with integer coefficients such that P(1) = 7 and P(7) = 1. Can P have an "
    "integer root? Prove your answer.",
    "How many 8-digit binary strings contain no two consecutive ones? Derive a general formula.",
]


def _word_problem(rng: random.Random) -> str:
    a, b, c, d = rng.randint(3, 40), rng.randint(2, 12), rng.randint(10, 90), rng.randint(2, 6)
    return C(rng, [
        f"A shop sells pens at ${b} each and notebooks at ${b + 3} each. Sam buys {a} items in total and "
        f"spends ${a * b + 3 * d}. After a {c}% discount on notebooks only, how much would he have paid?",
        f"Two trains leave stations {c * 10} km apart at {b}:00, one at {c} km/h and one {d * 5} km/h faster. "
        f"A bird flies between them at {c * 2} km/h until they meet. How far does the bird fly, and when?",
        f"A tank fills in {b} hours with pipe A and {b + d} hours with pipe B, while a drain empties it in "
        f"{a} hours. Starting empty with all three open, the drain is closed after 1 hour. When is it full?",
        f"Mia invests ${c * 100} at {d}% compounded quarterly and adds ${a * 10} each year. Her brother "
        f"invests ${c * 150} at {b}% simple interest. After how many years does Mia have more money?",
        f"A recipe for {d} people needs {b} eggs, {c * 10} g flour and {a} g sugar. I have 2 kg flour, "
        f"{a + 7} eggs and 500 g sugar. What is the largest number of people I can cook for, and what is left?",
    ])


def _reasoning(rng: random.Random) -> str:
    return C(rng, [
        C(rng, PUZZLES),
        f"Plan a {rng.randint(3, 6)}-day trip for a family with a toddler and a wheelchair user, with a budget "
        f"of ${rng.randint(12, 40) * 100}, no flights over 4 hours, and at least one museum per day. Justify "
        "each trade-off.",
        f"Our {C(rng, SYSTEMS)} saw p99 latency jump from 80 ms to 2 s after a deploy, but CPU and memory "
        "look normal. Walk me through a step-by-step root cause analysis and what evidence would rule out "
        "each hypothesis.",
        "Read these three conflicting witness statements and reconstruct the most likely timeline, noting "
        "which claims are inconsistent and why:\n1) ...\n2) ...\n3) ...",
        f"Design an experiment to test whether a new onboarding flow increases 30-day retention, given "
        f"only {rng.randint(2, 9)}k signups per month and strong weekly seasonality. Cover power and pitfalls.",
    ])


def _code(rng: random.Random) -> str:
    lang, system = C(rng, LANGS), C(rng, SYSTEMS)
    return C(rng, [
        f"Implement {C(rng, STRUCTS)} in {lang}, with tests and a complexity analysis.",
        f"Our {lang} {system} has {C(rng, BUGS)}. Here is the relevant code:\n```\n"
        "async def handle(req):\n    async with lock:\n        data = await fetch(req.id)\n"
        "        cache[req.id] = transform(data)\n    return cache[req.id]\n```\nFind the bug and fix it.",
        f"Design the architecture for a {system} handling {rng.randint(5, 90)}k requests/s with "
        "multi-region failover, exactly-once processing and a 99.99% SLO. Discuss data model, consistency "
        "and failure modes.",
        f"Refactor this 800-line {lang} class into smaller modules without changing behaviour, keeping "
        "backwards compatibility for existing callers and adding a migration plan.",
        f"Write a {lang} parser for a subset of SQL (SELECT with JOIN, WHERE, GROUP BY) that builds an AST "
        "and reports errors with line and column.",
        f"Optimise this O(n^2) {lang} routine that matches {rng.randint(1, 9)} million orders to trades by "
        "time window; memory is capped at 2 GB. Explain the algorithm and edge cases.",
        f"Write a {lang} implementation of Dijkstra with a decrease-key heap and prove its correctness.",
    ])


def _decision(rng: random.Random) -> str:
    topic = C(rng, DECISIONS)
    return C(rng, [
        f"Help me think through {topic}. Weigh the risks, second-order effects and what I might be missing.",
        f"I need a recommendation on {topic}. Lay out the options, the trade-offs and a decision framework.",
        f"Write a balanced memo for our board on {topic}, including the strongest argument against your "
        "recommendation.",
    ])


def _hard_math(rng: random.Random) -> str:
    return C(rng, HARD_MATH) + C(rng, ["", "", " Show all steps.", " Give a rigorous proof."])


DEEP_TOPICS = ["why transformers need positional encodings and how RoPE extends to long contexts",
               "how the Fed's balance-sheet runoff interacts with bank reserves and repo rates",
               "why quantum entanglement cannot be used to send information faster than light",
               "how CRISPR off-target effects are measured and what limits current methods",
               "the strongest arguments for and against moral realism",
               "how garbage collection pauses arise in the JVM and how ZGC avoids them",
               "why some proteins misfold and how that links to neurodegenerative disease",
               "how a central bank should respond to a supply shock versus a demand shock"]
AUDIENCES = ["a skeptical CFO", "a panel of domain experts", "a grieving friend", "a hostile journalist",
             "new hires in their first week", "a regulator"]


def _hard_chat(rng: random.Random) -> str:
    topic, audience = C(rng, DEEP_TOPICS), C(rng, AUDIENCES)
    return C(rng, [
        f"Explain {topic}. Be precise and point out where common explanations go wrong.",
        f"I've read conflicting takes on {topic}. Reconcile them and tell me which evidence is strongest.",
        f"Write a {rng.randint(600, 1500)}-word essay on {topic} for {audience}, with a clear thesis, "
        "counterarguments and citations of the kind of evidence that would settle it.",
        f"Draft a delicate message to {audience} explaining a layoff of {rng.randint(5, 40)}% of staff; it "
        "must be honest about the reasons, avoid legal exposure and keep trust.",
        f"Give me a critical review of this plan: we'll cut prices {rng.randint(10, 40)}% to gain share, fund "
        "it with debt, and expect competitors not to respond. What breaks first?",
    ])


def heavy_examples(rng: random.Random) -> list[Example]:
    """About 490 label-1 examples across the heavy task kinds."""
    return [
        *expand(rng, [_reasoning], 80, 1, "reasoning"),
        *expand(rng, [_code], 100, 1, "code"),
        *expand(rng, [_decision], 60, 1, "decision"),
        *expand(rng, [_hard_math], 56, 1, "math", difficulty=4),
        *expand(rng, [_word_problem], 80, 1, "math", difficulty=3),
        *expand(rng, [_hard_chat], 90, 1, "chat"),
    ]
