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


LANGS = ["Python", "Go", "Rust", "Java", "C", "TypeScript", "Elixir", "Swift"]
SERVICES = ["ride-hailing dispatcher", "ad auction", "chat server", "bank ledger", "video transcoder",
            "feature-flag service", "metrics database", "ticket booking site"]


def _easy_code(rng: random.Random) -> str:
    lang = C(rng, LANGS)
    return C(rng, [
        f"{lang.lower()}: how to read a text file line by line?", "What does `ls -la` show?",
        f"how do i check if a list is empty in {lang}", "SQL to select all rows from table users",
        "How do I install a package with pip?", "what's the difference between == and === in js",
        "rename a git branch locally?", f"{lang} snippet: squares of 1 to 10",
        f"what is a variable in {lang}?", f"how to make a string uppercase in {lang}",
    ])


def _hard_code(rng: random.Random) -> str:
    lang, svc = C(rng, LANGS), C(rng, SERVICES)
    return C(rng, [
        f"Build the core of a {svc} in {lang}: it must survive node crashes without double-processing. "
        "Give the design, the lease protocol and the code for the main loop.",
        f"My {svc} front-end re-renders a 10k-row table on every keystroke. Give a profile-driven plan to "
        "fix it, with virtualisation, memoisation pitfalls and the code changes.",
        f"Write a mark-and-sweep garbage collector for a toy Lisp in {lang}, then explain how to make it "
        "incremental with tri-colour marking and write barriers.",
        f"Our {svc} operator sometimes provisions storage twice. Find the likely reconciliation bug and "
        f"rewrite the loop in {lang} so it is idempotent under retries.",
        f"Implement a collaborative text-editing backend (an RGA-style CRDT) in {lang} and argue why "
        "replicas converge.",
        f"In {lang}, replace this numerically unstable variance computation with Welford's method and prove "
        "the formula for merging two partial results.",
    ])


def _easy_reasoning(rng: random.Random) -> str:
    p, q, r = rng.sample(PEOPLE, 3)
    return C(rng, [
        f"{p} is older than {q}, and {q} is older than {r}. Who is the youngest?",
        "If it rains the ground gets wet. The ground is dry. Did it rain?",
        f"{p} left at 3 pm and the trip takes one hour. When did {p} arrive?",
        "Which one doesn't belong: apple, banana, carrot, cherry?",
        f"If {p} always lies and says 'I am honest', is the statement true?",
        "What's heavier: 1 liter of water or 2 liters of water?",
    ])


def _hard_reasoning(rng: random.Random) -> str:
    cash, burn = rng.randint(8, 30) / 10, rng.randint(90, 300)
    return C(rng, [
        f"Our startup has ${cash}M left, burns ${burn}k/month and revenue grows 6% monthly from $40k. Should "
        "we cut staff, raise a bridge round or pivot? Model the scenarios and argue for one.",
        "A patient's symptoms fit two diagnoses whose treatments are dangerous if wrong. How should a "
        "clinician reason under this uncertainty? Discuss tests, priors and ethics.",
        f"{rng.randint(4, 6)} people must cross a bridge at night with one torch; they take 1, 2, 5, 10 (and "
        "more) minutes. What is the fastest schedule, and why does the greedy plan fail?",
        f"Critique this argument and find its hidden assumptions: 'Since crime fell {rng.randint(5, 30)}% "
        "after the new policy, the policy caused the drop, so every city should adopt it.'",
        f"Compare three ways to cut our cloud bill by {rng.randint(25, 50)}% without hurting latency, "
        "estimate the savings and organisational risk of each, and propose a sequenced plan.",
        "Write a negotiation strategy for a supplier contract where we depend on them but they need our "
        f"volume ({rng.randint(10, 90)}% of their sales); cover BATNA, anchoring and a multi-year clause.",
    ])


def _hard_chat(rng: random.Random) -> str:
    p = C(rng, PEOPLE)
    return C(rng, [
        f"My sister {p} and I disagree about moving our father into care. Help me understand both sides "
        "deeply and find a way to talk about it without a fight.",
        f"Is it ethical to {C(rng, ['eat meat', 'lie to protect a friend', 'break a bad law', 'have kids'])}? "
        "Steelman both positions and give your considered view.",
        f"Write a sonnet about {C(rng, THINGS)} in strict iambic pentameter whose line initials spell "
        f"{p.upper()}.",
        "What would actually happen to the economy if a country adopted a four-day work week overnight? "
        "Think through the second-order effects.",
        f"I got two offers: a startup paying {rng.randint(60, 95)}% of the big-company salary plus equity, "
        "or a stable job. I have a mortgage and a baby on the way. Walk me through the decision.",
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


LONG_NOTE = (
    "Notes from Tuesday's planning call. Attendees: {a}, {b}, {c}. We reviewed the spring catalogue, the "
    "new supplier for packaging, and the holiday rota. {a} will send the catalogue proofs by Friday; {b} "
    "asked for two more quotes for packaging; {c} is on leave from the 12th to the 19th. The team agreed "
    "to move the monthly review to Thursdays. Budget for the trade fair stays at the same level as last "
    "year. Someone should book the meeting room for the fair debrief. Next call in two weeks."
)
LONG_SNIPPET = """```js
function groupByCity(users) {
  const out = {};
  for (const u of users) {
    if (!out[u.city]) {
      out[u.city] = [];
    }
    out[u.city].push(u.name);
  }
  return out;
}
```"""


def _long_easy(rng: random.Random) -> str:
    a, b, c = rng.sample(PEOPLE, 3)
    note = LONG_NOTE.format(a=a, b=b, c=c)
    return C(rng, [
        f"{note}\n\nWho is on leave, and when?",
        f"{note}\n\nTurn these notes into a bullet list of action items with owners.",
        f"{LONG_SNIPPET}\n\nWhat does this function return for an empty list?",
        f"{LONG_SNIPPET}\n\nPlease add comments explaining each line.",
    ])


def _short_hard(rng: random.Random) -> str:
    return C(rng, [
        "Prove there is no largest prime gap.", "Is e + pi known to be irrational? Explain precisely.",
        "Write a lock-free ring buffer in C11 atomics.", "Prove the AM-GM inequality by induction.",
        "Two envelopes paradox: resolve it rigorously.", "Implement Raft log compaction.",
        "Sleeping Beauty problem: halfer or thirder? Defend.", "Derive the Kalman filter update.",
    ])


def eval_examples(rng: random.Random) -> list[Example]:
    """About 330 held-out examples in four kinds (chat, code, reasoning, math), each with easy (label 0)
    and hard (label 1) prompts; math is a 4-level ladder (difficulty 1..4, levels 3-4 labelled hard)."""
    rows = [
        *expand(rng, [_easy_chat, _easy_task], 60, 0, "chat"),
        *expand(rng, [_hard_chat], 25, 1, "chat"),
        *expand(rng, [_easy_code], 25, 0, "code"),
        *expand(rng, [_hard_code], 25, 1, "code"),
        *expand(rng, [_easy_reasoning], 25, 0, "reasoning"),
        *expand(rng, [_hard_reasoning], 25, 1, "reasoning"),
        *expand(rng, [_long_easy], 30, 0, "confounder"),
        *expand(rng, [_short_hard], 8, 1, "confounder"),
    ]
    for level in (1, 2, 3, 4):
        maker = [lambda r, lv=level: _math_ladder(r, lv)]
        rows += expand(rng, maker, 30, int(level >= 3), "math", difficulty=level)
    return rows
