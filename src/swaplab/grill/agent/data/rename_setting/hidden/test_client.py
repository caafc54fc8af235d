import json
from pathlib import Path

import client


def test_the_client_reads_the_renamed_setting():
    assert client.timeout_seconds() == 2.5
    assert client.retries() == 3


def test_the_client_follows_the_setting():
    path = Path("other_config.json")
    path.write_text(json.dumps({"request_timeout_ms": 750, "retries": 1}))
    assert client.timeout_seconds(path) == 0.75
