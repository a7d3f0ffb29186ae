"""Built-in seed prompts for self-distillation: generic, by category, and none of them the bundled
benchmark requests (specgen/data/requests.jsonl), so the benchmark measures heads on prompts they
never saw. A test keeps the two sets apart."""

from __future__ import annotations

from pathlib import Path

SEEDS: dict[str, tuple[str, ...]] = {
    "code": (
        "Write a Python function that returns the n-th Fibonacci number iteratively.\n\n```python\n",
        "Write a Python class `Stack` with push, pop and peek methods.\n\n```python\n",
        "Write a function in JavaScript that removes duplicate values from an array.\n\n```js\n",
        "Write a SQL query that lists the ten customers with the highest total order amount.\n\n```sql\n",
        "Write a shell script that counts the lines of every .txt file in a folder.\n\n```bash\n",
        "Write a Python function that checks whether a string is a palindrome, ignoring case.\n\n```python\n",
        "Implement binary search over a sorted list in Python, with a docstring.\n\n```python\n",
        "Write a Rust function that sums the even numbers of a vector.\n\n```rust\n",
        "Write a Python script that reads a CSV file and prints the average of its second column.\n\n```python\n",
        "Write a C function that reverses a string in place.\n\n```c\n",
    ),
    "explain": (
        "Explain what a hash table is and why lookups are fast.",
        "Explain the difference between a process and a thread.",
        "What causes the seasons on Earth?",
        "How does a refrigerator keep food cold?",
        "Explain what inflation is to a high-school student.",
        "What is photosynthesis, and why does it matter?",
        "Explain how public-key cryptography works in simple terms.",
        "Why is the sky blue?",
        "What is the difference between weather and climate?",
        "Explain recursion with a simple example.",
    ),
    "writing": (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Write a polite email asking a colleague to review a document by Friday.",
        "Write a product description for a reusable water bottle.",
        "Write a short poem about autumn rain.",
        "Write a cover letter opening paragraph for a junior data analyst position.",
        "Describe a busy morning market in a small coastal town.",
        "Write a short speech thanking volunteers at a community event.",
        "Write a diary entry from an astronaut on her first day in orbit.",
    ),
    "list": (
        "List ten tips for keeping a houseplant healthy.",
        "Give five ideas for a rainy-day activity with children.",
        "List the planets of the solar system with one fact about each.",
        "What are the main steps to prepare for a job interview?",
        "List seven common mistakes beginners make when learning to cook.",
        "Give a packing list for a three-day hiking trip.",
        "List the pros and cons of working from home.",
        "Name eight good habits for writing clear code.",
    ),
    "rewrite": (
        "Rewrite the following sentence in a formal tone: hey, the meeting got moved to 3, don't be late.",
        "Turn these notes into full sentences: milk - 2 litres; bread - wholegrain; call plumber Tuesday.",
        ("Summarize in two sentences: The city council met on Monday to discuss the new bus routes. Residents "
         "asked for more stops near the hospital, and the council agreed to study the idea before the budget vote."),
        "Convert this list to a Markdown table with columns name and age: Anna 31, Ben 27, Chloe 45, Dev 38.",
        "Translate into plain English: The aforementioned party shall remit payment forthwith upon receipt.",
        "Rewrite as a bulleted list: We need to book the venue, order food, send invitations and hire a DJ.",
    ),
    "math": (
        "A train travels 180 km in 2 hours and 15 minutes. What is its average speed? Show your steps.",
        "Solve for x: 3x + 7 = 25. Explain each step.",
        "What is 15 percent of 240, and how do you compute it?",
        "A rectangle has a perimeter of 36 cm and a width of 7 cm. What is its area?",
        "Explain how to convert 68 degrees Fahrenheit to Celsius.",
        "If a shirt costs 40 dollars after a 20 percent discount, what was the original price?",
    ),
}


# Subjects for the requests a writer makes up (specgen.heads.layer_fit.invented_prompts): broad
# on purpose, so the replies a layer learns from reach past the fixed seeds' few topics.
TOPICS: tuple[str, ...] = (
    "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "C#", "Ruby", "PHP", "Kotlin", "Swift",
    "shell scripting", "regular expressions", "data structures", "algorithms", "sorting", "graphs", "dynamic programming",
    "object-oriented design", "functional programming", "testing", "debugging", "performance", "concurrency",
    "networking", "HTTP and web APIs", "HTML and CSS", "front-end frameworks", "databases", "SQL", "data analysis",
    "pandas", "machine learning", "statistics", "security", "cryptography", "operating systems", "Linux", "git",
    "Docker and containers", "cloud computing", "compilers", "file formats", "command-line tools", "code review",
    "software architecture", "documentation", "mathematics", "physics", "chemistry", "biology", "astronomy",
    "history", "geography", "economics", "personal finance", "health", "cooking", "travel", "sports", "music",
    "literature", "language learning", "writing", "careers", "education", "productivity", "philosophy", "law",
    "marketing", "small business", "the environment", "engineering",
)
KINDS: tuple[str, ...] = ("question", "programming task that asks for code", "request to explain something",
                          "request to write a short text", "request for a list", "request to fix or improve some code")
INVENT = ("Write one new {kind} that a user might send to an AI assistant about {topic}. "
          "Reply with the request alone, as the user would type it.")


def library_seeds(chars: int = 600) -> list[tuple[str, str]]:
    """("docs", passage): the opening of each topic of the Python reference that ships with Python
    (`pydoc_data.topics`, 79 topics of prose and code; 78 distinct openings), cut at a paragraph break: varied text on any
    machine without a download; none where a distribution left the module out."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    out = []
    for name in sorted(topics):
        text = topics[name].strip()
        cut = text.rfind("\n\n", 0, chars)
        passage = text[: cut if cut > chars // 3 else chars].strip()
        if passage and ("docs", passage) not in out:  # two topics can open alike
            out.append(("docs", passage))
    return out


def library_text() -> list[tuple[str, str]]:
    """("docs" | "source", text) for teacher-forced training when no files are given: every topic of
    the Python reference (`pydoc_data.topics`, about 465,000 characters of prose and code) and the
    source of the standard library's top-level modules, all of it on any machine that has Python."""
    import sysconfig

    out = []
    try:
        from pydoc_data.topics import topics

        out += [("docs", topics[name]) for name in sorted(topics) if topics[name].strip()]
    except ImportError:
        pass
    lib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(lib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            out.append(("source", text))
    return out


def builtin_seeds() -> list[tuple[str, str]]:
    """(category, prompt) for every built-in seed: the prompts above and the library's passages."""
    return [(cat, text) for cat, texts in SEEDS.items() for text in texts] + library_seeds()
