"""Training prompts the micro pool handles well (label 0): chit-chat, classification, extraction, short
summaries, rewrites, translation, look-ups, one-step arithmetic and small code snippets."""

from __future__ import annotations

import random

from router_models.datagen.common import Example, expand

__all__ = ["light_examples"]

C = random.Random.choice

NAMES = ["Maria Lopez", "Tom Becker", "Aiko Tanaka", "Priya Nair", "Jonas Weber", "Fatima Khan", "Liam O'Brien",
         "Chen Wei", "Sofia Rossi", "Kwame Mensah", "Elena Petrova", "Diego Alvarez", "Hannah Schmidt"]
CITIES = ["Lisbon", "Osaka", "Denver", "Nairobi", "Krakow", "Toronto", "Lyon", "Austin", "Seoul", "Dublin"]
PRODUCTS = ["wireless earbuds", "standing desk", "coffee grinder", "running shoes", "phone case", "air fryer",
            "laptop stand", "yoga mat", "electric kettle", "backpack", "smart watch", "desk lamp"]
REVIEWS_POS = ["Arrived early and works perfectly, very happy.", "Great value, would buy again!",
               "Exactly as described, the quality surprised me.", "Love it. Setup took two minutes."]
REVIEWS_NEG = ["Broke after a week, total waste of money.", "The color is nothing like the photos.",
               "Customer support never answered my emails.", "Way too loud and it smells like plastic."]
REVIEWS_MIX = ["Good sound but the battery barely lasts a day.", "Nice design, shipping was slow though."]
TOPICS = ["billing", "technical issue", "account access", "shipping", "refund request", "feature request"]
TICKETS = ["I was charged twice for my subscription this month.", "The app crashes when I open settings.",
           "I can't log in since I changed my phone number.", "My package has been stuck in transit for 9 days.",
           "Please add a dark mode to the dashboard.", "I want my money back for the unused annual plan."]
GREETINGS = ["hi", "hello!", "hey there", "good morning", "thanks a lot!", "thank you, that helped",
             "how are you today?", "what's up", "lol that's funny", "ok cool", "bye, have a nice day",
             "hey, are you a bot?", "good night!", "nice, thanks", "yo", "can you hear me?"]
CHAT = ["what's your favorite color?", "tell me a fun fact about {animal}", "recommend a movie for tonight",
        "tell me a short joke about {animal}s", "what should I name my {animal}?",
        "any tips for a rainy weekend in {city}?", "say something nice to cheer me up",
        "what's a good name for a cat?", "give me a random word", "how do you say hello in {lang}?"]
ANIMALS = ["cat", "penguin", "octopus", "dog", "owl", "giraffe", "hamster", "dolphin"]
LANGS = ["French", "Spanish", "German", "Italian", "Japanese", "Portuguese", "Dutch"]
SENTENCES = ["The meeting is moved to Thursday at 3 pm.", "Please send me the invoice by Friday.",
             "Our store opens at nine in the morning.", "I would like to book a table for two.",
             "The train to the airport leaves every twenty minutes.", "Thank you for your quick reply."]
FACTS = ["What is the capital of {country}?", "Who wrote '{book}'?", "How many legs does a spider have?",
         "What is the boiling point of water in Fahrenheit?", "What year did the Berlin Wall fall?",
         "What does CPU stand for?", "What is the chemical symbol for gold?", "Define the word '{word}'.",
         "Give me a synonym for '{word}'.", "What time zone is {city} in?", "Spell '{word}' backwards."]
COUNTRIES = ["Portugal", "Kenya", "Canada", "Vietnam", "Chile", "Norway", "Egypt", "New Zealand", "Peru"]
BOOKS = ["Pride and Prejudice", "1984", "One Hundred Years of Solitude", "The Hobbit", "Beloved"]
WORDS = ["ephemeral", "happy", "quick", "resilient", "ambiguous", "candid", "meticulous", "serene"]
SNIPPETS = ["reverses a string", "checks if a number is even", "returns the max of a list",
            "counts the vowels in a word", "converts Celsius to Fahrenheit", "removes duplicates from a list",
            "capitalizes the first letter of each word", "sums the numbers in a list"]
PLANGS = ["Python", "JavaScript", "Go", "Java", "Ruby", "TypeScript", "Bash", "C#"]
PASSAGES = [
    "Our quarterly revenue grew 8% to $4.2M, driven by the new enterprise tier. Churn fell slightly. "
    "Hiring slowed as we focus on profitability, and the mobile app relaunch is planned for March.",
    "The city council voted 7-2 to extend the bike lane on Main Street. Construction starts in June and "
    "will close one car lane for six weeks. Local shops worry about deliveries during the works.",
    "Researchers found that people who walked 30 minutes a day slept about 20 minutes longer on average. "
    "The study followed 2,000 adults for one year, but the authors caution it shows correlation only.",
    "Hi team, the release is delayed by two days because QA found a login bug on Android. The fix is "
    "merged; we will run the regression suite tomorrow and ship on Thursday if it passes. - Ana",
    "The museum will be closed on Monday for maintenance. Tickets bought for that day can be used any "
    "other day this month, and members keep free entry to the new photography exhibition.",
]


def _fill(rng: random.Random, template: str) -> str:
    return template.format(
        animal=C(rng, ANIMALS), city=C(rng, CITIES), lang=C(rng, LANGS), country=C(rng, COUNTRIES),
        book=C(rng, BOOKS), word=C(rng, WORDS),
    )


def _chit(rng: random.Random) -> str:
    return C(rng, GREETINGS) if rng.random() < 0.45 else _fill(rng, C(rng, CHAT))


def _classify(rng: random.Random) -> str:
    review = C(rng, REVIEWS_POS + REVIEWS_NEG + REVIEWS_MIX)
    product = C(rng, PRODUCTS)
    return C(rng, [
        f"Classify the sentiment of this review as positive, negative or neutral: \"{review}\"",
        f"Is this {product} review positive or negative? {review}",
        f"Label the sentiment (pos/neg): {review}",
        f"Which category does this support ticket belong to ({', '.join(TOPICS)})? \"{C(rng, TICKETS)}\"",
        f"Is this email spam? Answer yes or no.\n\nSubject: You won a free {product}! Click here to claim.",
        f"Tag this message with one topic from: {', '.join(rng.sample(TOPICS, 4))}.\n{C(rng, TICKETS)}",
    ])


def _extract(rng: random.Random) -> str:
    name, city = C(rng, NAMES), C(rng, CITIES)
    day, amount = rng.randint(1, 28), rng.randint(20, 900)
    return C(rng, [
        f"Extract the name, city and date from: \"{name} will arrive in {city} on March {day}.\" Return JSON.",
        f"Pull out all email addresses from this text: contact {name.split()[0].lower()}@example.com or "
        f"sales@{city.lower()}shop.com for details.",
        f"From this invoice line get the amount and due date as JSON: 'Invoice #{rng.randint(100, 999)} - "
        f"${amount}.00 due {day}/06'",
        f"List the people mentioned: {name} met {C(rng, NAMES)} and {C(rng, NAMES)} at the {city} office.",
        f"What is the phone number in this message? 'Call me back at +1 555 {rng.randint(100, 999)} "
        f"{rng.randint(1000, 9999)} after 5pm, {name.split()[0]}'",
        f"Convert to JSON with keys product, qty, price: {rng.randint(1, 9)} x {C(rng, PRODUCTS)} at ${amount}",
    ])


def _summary(rng: random.Random) -> str:
    passage = C(rng, PASSAGES)
    return C(rng, [
        f"Summarize in one sentence:\n\n{passage}",
        f"TL;DR please: {passage}",
        f"Give me 3 bullet points summarizing this:\n{passage}",
        f"Write a short headline for this text: {passage}",
        f"Summarize this email for my manager in two lines:\n\n{passage}",
    ])


def _rewrite(rng: random.Random) -> str:
    s = C(rng, SENTENCES)
    return C(rng, [
        f"Translate to {C(rng, LANGS)}: {s}",
        f"Make this sound more formal: {s.lower()}",
        f"Fix the grammar: '{s.replace('the ', 'teh ', 1).replace('is ', 'are ', 1)}'",
        f"Rephrase this more politely: {s}",
        f"Turn this into a friendly text message: {s}",
        f"Write a two-sentence out-of-office reply. I'm back on {C(rng, ['Monday', 'the 3rd', 'June 12'])}.",
        f"Write a short birthday message for my coworker {C(rng, NAMES).split()[0]}.",
    ])


def _lookup(rng: random.Random) -> str:
    return _fill(rng, C(rng, FACTS))


def _arith(rng: random.Random) -> str:
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    return C(rng, [
        f"What is {a} + {b}?", f"{a} * {b} = ?", f"what's {b}% of {a * 10}",
        f"Convert {a} minutes to hours and minutes.", f"How many days are in {b} weeks?",
        f"Round {a}.{b} to the nearest whole number.", f"Is {a} greater than {b * 11}?",
        f"If a shirt costs ${b} and I buy 2, how much do I pay?",
    ])


def _snippet(rng: random.Random) -> str:
    lang, what = C(rng, PLANGS), C(rng, SNIPPETS)
    return C(rng, [
        f"Write a {lang} function that {what}.", f"How do I print hello world in {lang}?",
        f"In {lang}, how do I get the length of an array?", f"Quick {lang} one-liner that {what}?",
        "What does `git status` do?", f"How do I comment out a line in {lang}?",
        f"What's the {lang} syntax for a for loop?",
    ])


CONCEPTS = ["photosynthesis", "inflation", "a black hole", "an API", "compound interest", "the water cycle",
            "a vaccine", "machine learning", "a mortgage", "DNS", "gravity", "a recession", "a blockchain"]
ITEMS = ["apples", "marbles", "books", "cookies", "tickets", "stamps", "pencils", "cupcakes"]


def _easy_reasoning(rng: random.Random) -> str:
    a, b = rng.randint(3, 20), rng.randint(1, 9)
    n1, n2 = rng.sample([n.split()[0] for n in NAMES], 2)
    return C(rng, [
        f"If {n1} is taller than {n2}, who is shorter?",
        "Which is heavier, a kilogram of feathers or a kilogram of steel?",
        f"What comes next: {a}, {a + b}, {a + 2 * b}, ...?",
        "All cats are animals. Tom is a cat. Is Tom an animal?",
        f"If today is {C(rng, ['Monday', 'Friday', 'Sunday'])}, what day is it in two days?",
        "I put my keys in the drawer and then moved the drawer's contents to a box. Where are my keys?",
        f"Is it a good idea to wear a coat when it is {C(rng, ['-5', '2', '30'])} degrees Celsius outside?",
        f"{n1} has more {C(rng, ITEMS)} than {n2}. {n2} has {a}. Could {n1} have {a - 1}?",
    ])


def _simple_word_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
    n, item = C(rng, NAMES).split()[0], C(rng, ITEMS)
    return C(rng, [
        f"{n} has {a} {item} and buys {b} more. How many {item} does {n} have now?",
        f"There are {c} boxes with {b} {item} in each. How many {item} are there in total?",
        f"{n} shares {b * c} {item} equally among {c} friends. How many does each friend get?",
        f"A ticket costs ${b}. How much do {c} tickets cost?",
        f"{n} reads {b} pages a day. How many pages does {n} read in {c} days?",
    ])


def _simple_explain(rng: random.Random) -> str:
    concept = C(rng, CONCEPTS)
    return C(rng, [
        f"Explain {concept} in simple terms.", f"What is {concept}? One paragraph please.",
        f"ELI5: {concept}", f"Give me a one-line definition of {concept}.",
        f"What's a simple example of {concept}?",
    ])


def light_examples(rng: random.Random) -> list[Example]:
    """About 590 label-0 examples across the light task kinds."""
    return [
        *expand(rng, [_chit], 80, 0, "chitchat"),
        *expand(rng, [_classify], 70, 0, "classification"),
        *expand(rng, [_extract], 70, 0, "extraction"),
        *expand(rng, [_summary], 40, 0, "summary"),
        *expand(rng, [_rewrite], 60, 0, "rewrite"),
        *expand(rng, [_lookup], 50, 0, "lookup"),
        *expand(rng, [_arith], 45, 0, "math", difficulty=1),
        *expand(rng, [_snippet], 45, 0, "code"),
        *expand(rng, [_easy_reasoning], 45, 0, "reasoning"),
        *expand(rng, [_simple_word_problem], 50, 0, "math", difficulty=2),
        *expand(rng, [_simple_explain], 45, 0, "chitchat"),
    ]
