"""Build ``tiny_corpus.txt``, the English text the demo trains on.

Run from the repository root: ``.venv/bin/python torchtpu/data/build_corpus.py``.
The output is committed, so nothing is downloaded or generated at runtime.

Every part is free to use:
  * The Zen of Python (PEP 20, placed in the public domain), decoded from
    Python's own ``this`` module.
  * ``essays.txt``: short fables and essays written for this project and
    dedicated to the public domain (CC0).
  * Short village stories produced here from a small grammar with a fixed
    seed, so the file is reproducible byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import random

HERE = pathlib.Path(__file__).parent
TARGET_BYTES = 100_000
SEED = 1234

PRONOUNS = {"Ada": "she", "Tom": "he", "Mara": "she", "Ben": "he", "Lena": "she", "Hugo": "he", "Iris": "she",
            "Owen": "he", "Nell": "she", "Felix": "he", "Rosa": "she", "Jonah": "he", "Clara": "she",
            "Walter": "he", "Edith": "she", "Simon": "he", "Greta": "she", "Arthur": "he", "Maud": "she",
            "Peter": "he"}
NAMES = sorted(PRONOUNS)
TRADES = ["miller", "baker", "weaver", "fisherman", "shepherd", "potter", "carpenter", "smith", "gardener",
          "teacher", "clockmaker", "ferryman", "beekeeper", "cobbler", "innkeeper", "mapmaker"]
PLACES = ["the river", "the old bridge", "the market", "the hill above the town", "the mill", "the harbour",
          "the edge of the forest", "the church square", "the orchard", "the lighthouse", "the long road",
          "the village well", "the meadow", "the quiet lane behind the inn"]
TIMES = ["At dawn", "Early one morning", "At noon", "In the late afternoon", "One evening", "Before the sun rose",
         "On the first day of spring", "In the middle of winter", "After the harvest", "On a windy Tuesday"]
WEATHER = ["the sky was clear and pale", "a thin rain was falling", "the wind came cold from the north",
           "the fog lay low over the fields", "the air was warm and still", "snow had covered the roofs",
           "dark clouds were gathering in the west", "the sun was bright on the water"]
FOUND = ["a small wooden box", "a lost lamb", "a letter with no name on it", "an old brass key",
         "a basket of red apples", "a broken wheel", "a stranger asleep under a tree", "a map drawn in ink",
         "a silver button", "a nest of three blue eggs", "a boat tied to a post", "a sack of flour"]
FEELINGS = ["surprised", "worried", "curious", "glad", "puzzled", "tired but pleased", "a little afraid", "calm"]
ACTIONS = ["carried it home", "asked everyone in the village about it", "wrote it down in a notebook",
           "showed it to the oldest woman in town", "left it where it was and went for help",
           "sat down to think for a while", "took it to the mayor", "kept it safe until morning"]
ENDINGS = ["By evening the matter was settled, and everyone went home to supper.",
           "Nobody ever learned the whole story, but the village talked about it for years.",
           "The next day the owner came looking for it, and was very grateful.",
           "In the end it was a small thing, but it was remembered for a long time.",
           "That night the stars came out, one by one, and the town was quiet.",
           "It was, as the old people say, a lesson worth the trouble.",
           "After that, the two of them were friends for the rest of their lives."]
SAYINGS = ["Measure twice and cut once.", "A little every day is a lot by the end of the year.",
           "Slow water runs deep.", "Check the scales before you sell.", "Mend the roof while the sun shines.",
           "One honest answer is worth ten clever ones.", "Ask the field before you plant it.",
           "Many threads make a strong cloth.", "Patience wears down the hardest stone."]
NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "twenty"]


def zen_of_python() -> str:
    """PEP 20, decoded from the rot13 text in Python's ``this`` module (which prints on import)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return "".join(this.d.get(c, c) for c in this.s) + "\n"


def village_story(rng: random.Random) -> str:
    name, friend = rng.sample(NAMES, 2)
    trade, friend_trade = rng.sample(TRADES, 2)
    place, other_place = rng.sample(PLACES, 2)
    he_she = PRONOUNS[name]
    saying, reply = rng.sample(SAYINGS, 2)
    sentences = [
        f"{rng.choice(TIMES)}, {name} the {trade} walked to {place}.",
        f"{rng.choice(WEATHER).capitalize()}, and {he_she} had {rng.choice(NUMBERS)} things to do before dark.",
        f"Near {other_place}, {he_she} found {rng.choice(FOUND)}.",
        f"{name} was {rng.choice(FEELINGS)}, so {he_she} {rng.choice(ACTIONS)}.",
        f"{friend} the {friend_trade} came by and said, \"{saying}\"",
        f"{name} laughed and answered, \"{reply}\"",
        rng.choice(ENDINGS),
    ]
    if rng.random() < 0.5:  # vary the shape of the paragraphs a little
        sentences.pop(rng.randrange(1, 4))
    return " ".join(sentences) + "\n\n"


def build() -> str:
    rng = random.Random(SEED)
    parts = [zen_of_python(), "\n", (HERE / "essays.txt").read_text(), "\n"]
    stories = []
    while sum(map(len, parts)) + sum(map(len, stories)) < TARGET_BYTES:
        stories.append(village_story(rng))
    return "".join(parts + ["Village Stories\n\n"] + stories)


if __name__ == "__main__":
    out = HERE / "tiny_corpus.txt"
    out.write_text(build())
    print(f"wrote {out} ({out.stat().st_size} bytes)")
