import re
from collections import Counter


def top_k_words(text: str, k: int) -> list[str]:
    if k <= 0:
        return []
    counts = Counter(word.lower() for word in re.findall(r"[A-Za-z]+", text))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word for word, _ in ranked[:k]]
