"""Held-out "mixed traffic" prompts, written apart from the training templates (other wording, other
content), plus a graded-difficulty math ladder (1: one-step arithmetic ... 4: olympiad-style).

Never train on these: they estimate how the router does on traffic unlike its training data.
"""

from __future__ import annotations

import random

from router_models.datagen.common import Example, expand

__all__ = ["eval_examples"]

C = random.Random.choice

PEOPLE = ["Nadia", "Oskar", "Ravi", "Greta", "Tomasz", "Yuki", "Amara", "Lucas", "Ingrid", "Mateo"]
THINGS = ["sourdough starter", "team offsite", "garden shed", "podcast intro", "wedding toast", "bug report"]


def _easy_chat(rng: random.Random) -> str:
    p = C(rng, PEOPLE)
    return C(rng, [
        "heyyy", "morning! how's it going", "you're awesome, cheers", "sup bot", "thx!",
        f"my name is {p}, nice to meet you", "do you like music?", "what day is it today?",
        f"can you suggest a name for my {C(rng, THINGS)}?", "tell me something interesting",
        f"write a one-line caption for a photo of my {C(rng, ['dog', 'lunch', 'bike', 'balcony'])}",
        "is it better to drink tea or coffee in the morning?", "what rhymes with orange?",
    ])


def _easy_task(rng: random.Random) -> str:
    p, q = C(rng, PEOPLE), C(rng, PEOPLE)
    return C(rng, [
        f"Find the dates in this note and list them: 'Dentist on 4 May, {p}'s party on the 19th.'",
        f"Get the order number out of this: 'Hello, order A-{rng.randint(10000, 99999)} never arrived.'",
        f"Which language is this sentence in? '{C(rng, ['Dankjewel voor alles', 'Obrigado pela ajuda'])}'",
        "Rate the tone of this tweet from 1 to 5: 'Another Monday, another broken coffee machine.'",
        f"Shorten this to under 10 words: '{p} and {q} will present the roadmap at the all-hands meeting.'",
        f"Put these in alphabetical order: {', '.join(rng.sample(PEOPLE, 5))}",
        f"Is '{C(rng, ['recieve', 'separate', 'definately', 'necessary'])}' spelled correctly?",
        "Give this paragraph a title: 'Plants need light, water and nutrients. Without light they cannot "
        "photosynthesise, and they slowly starve.'",
        f"Reply to {p} saying I can't make the meeting tomorrow but Friday works.",
        "Mark each as fruit or vegetable: carrot, mango, leek, plum",
    ])


def _easy_code(rng: random.Random) -> str:
    return C(rng, [
        "python: how to read a text file line by line?", "What does `ls -la` show?",
        "js how to check if an array is empty", "SQL to select all rows from table users",
        "How do I install a package with pip?", "what's the difference between == and === in js",
        "rename a git branch locally?", "Python list comprehension for squares of 1 to 10",
    ])


def _hard_code(rng: random.Random) -> str:
    return C(rng, [
        "Build a distributed cron service: jobs must run exactly once across 5 nodes even during network "
        "partitions. Give the design, the leader/lease protocol and the Go code for the core loop.",
        "My React app re-renders a 10k-row table on every keystroke. Profile-driven plan to fix it, with "
        "virtualisation, memoisation pitfalls and the code changes.",
        "Write a garbage collector for a toy Lisp interpreter in C: mark-and-sweep first, then explain how "
        "you'd turn it into an incremental tri-colour collector.",
        "Given this Kubernetes operator that sometimes double-provisions volumes, identify the reconciliation "
        "bug and rewrite the loop to be idempotent.",
        "Implement a CRDT-based collaborative text editor backend (RGA or similar) and explain convergence.",
        "Translate this numerically unstable variance computation to Welford's algorithm in Rust and prove "
        "the update is correct for merging two partial results.",
    ])


def _hard_reasoning(rng: random.Random) -> str:
    return C(rng, [
        "Our startup has $1.2M left, burns $150k/month and revenue grows 6% monthly from $40k. Should we cut "
        "staff, raise a bridge round or pivot? Model the scenarios and argue for one.",
        "A patient's symptoms fit two diagnoses with different treatments that are dangerous if wrong. How "
        "should a clinician reason under this uncertainty? Discuss tests, priors and ethics.",
        "Four people need to cross a bridge at night with one torch; they take 1, 2, 5 and 10 minutes. "
        "What is the fastest schedule, and why is the greedy approach not optimal?",
        "Critique this argument and find its hidden assumptions: 'Since crime fell after the new policy, "
        "the policy caused the drop, so every city should adopt it.'",
        "Compare three ways to reduce our cloud bill by 40% without hurting latency, estimate savings for "
        "each and the organisational risks, and propose a sequenced plan.",
        "Write the negotiation strategy for a supplier contract where we depend on them but they need our "
        "volume; consider BATNA, anchoring and a multi-year pricing clause.",
    ])


def _math_ladder(rng: random.Random, level: int) -> str:
    a, b, c = rng.randint(12, 99), rng.randint(3, 19), rng.randint(2, 9)
    if level == 1:
        return C(rng, [f"{a} - {b}?", f"calculate {a} times {c}", f"half of {a * 2}?", f"{a} plus {b * 7}"])
    if level == 2:
        return C(rng, [
            f"{PEOPLE[b % 10]} has {a} stickers and gives away {b}. How many are left?",
            f"A pack has {c} pencils. How many pencils are in {b} packs?",
            f"A movie starts at 7:{10 + b} pm and lasts {a + 60} minutes. When does it end?",
        ])
    if level == 3:
        return C(rng, [
            f"A bakery sells muffins for ${c} and cakes for ${c * 4}. On Monday it sold {a} muffins and "
            f"{b} cakes; on Tuesday twice as many muffins but {b - 2} fewer cakes... wait, {b // 2} fewer. "
            "What was the total revenue over both days, and the percentage change day over day?",
            f"{PEOPLE[c]} walks to school at {c} km/h and runs back at {c * 2} km/h; the round trip takes "
            f"{a} minutes. How far is the school, and what is the average speed?",
            f"A phone plan costs ${a} per month plus ${c}/GB over {b} GB. Another costs ${a + 15} with "
            "unlimited data. For which monthly usage is the second plan cheaper, and by how much at 30 GB?",
        ])
    return C(rng, [
        f"Find all integer solutions of x^2 - {c}y^2 = 1 with x < 1000, and prove there are infinitely many.",
        f"Prove that for every positive integer n, {c}^(2n) - 1 is divisible by {c * c - 1}.",
        "In triangle ABC the incircle touches BC at D. Prove that the circles inscribed in ABD and ACD are "
        "tangent to each other.",
        f"Determine the number of subsets of {{1, ..., {a}}} whose element sum is divisible by {c}.",
        "Let f be continuous on [0,1] with f(0)=f(1). Show that for every n there is x with f(x)=f(x+1/n).",
    ])


def eval_examples(rng: random.Random) -> list[Example]:
    """About 260 held-out examples: mixed traffic (label 0/1) and a 4-level math ladder (difficulty 1..4)."""
    rows = [
        *expand(rng, [_easy_chat], 35, 0, "chat"),
        *expand(rng, [_easy_task], 40, 0, "task"),
        *expand(rng, [_easy_code], 8, 0, "code"),
        *expand(rng, [_hard_code], 6, 1, "code"),
        *expand(rng, [_hard_reasoning], 6, 1, "reasoning"),
    ]
    for level in (1, 2, 3, 4):
        maker = [lambda r, lv=level: _math_ladder(r, lv)]
        rows += expand(rng, maker, 30, int(level >= 3), "math", difficulty=level)
    return rows
