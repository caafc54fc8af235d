import re
from collections import Counter


def top_k_words(text: str, k: int) -> list[str]:
    # Near miss: ties keep the order words first appeared in, not alphabetical order.
    if k <= 0:
        return []
    counts = Counter(word.lower() for word in re.findall(r"[A-Za-z]+", text))
    return [word for word, _ in counts.most_common(k)]
