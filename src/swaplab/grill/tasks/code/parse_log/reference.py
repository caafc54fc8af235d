import re

ENTRY = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<fraction>\d{1,6}))?"
    r"\s+\[\s*(?P<level>[A-Za-z]+)\s*\]"
    r"(?:\s+\((?P<thread>[^)]*)\))?"
    r"(?:\s(?P<message>.*))?$"
)
LEVELS = {
    "DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "WARN": "WARNING",
    "ERROR": "ERROR", "ERR": "ERROR", "CRITICAL": "CRITICAL", "CRIT": "CRITICAL", "FATAL": "CRITICAL",
}


def parse_log(text: str) -> list[dict]:
    entries = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        match = ENTRY.match(line)
        if match and match["level"].upper() in LEVELS:
            timestamp = f"{match['date']}T{match['time']}"
            if match["fraction"]:
                timestamp += f".{match['fraction']}"
            entries.append({
                "timestamp": timestamp,
                "level": LEVELS[match["level"].upper()],
                "thread": match["thread"],
                "message": (match["message"] or "").strip(),
            })
        elif entries:
            entries[-1]["message"] += "\n" + line
    return entries
