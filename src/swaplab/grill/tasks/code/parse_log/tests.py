from solution import parse_log


def test_the_three_shapes():
    text = (
        "2024-03-01 12:00:01,123 [WARN ] (worker-3) Disk usage at 91%\n"
        "2024-03-01T12:00:02.5 [info] cache warmed\n"
        "2024-03-01 12:00:03 [  ERROR  ] (main) Request failed: timeout\n"
    )
    assert parse_log(text) == [
        {"timestamp": "2024-03-01T12:00:01.123", "level": "WARNING", "thread": "worker-3", "message": "Disk usage at 91%"},
        {"timestamp": "2024-03-01T12:00:02.5", "level": "INFO", "thread": None, "message": "cache warmed"},
        {"timestamp": "2024-03-01T12:00:03", "level": "ERROR", "thread": "main", "message": "Request failed: timeout"},
    ]


def test_traceback_continues_the_message():
    text = (
        "2024-03-01 12:00:03 [ERROR] (main) Unhandled exception\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 10, in <module>\n'
        "    run()   \n"
        "ValueError: bad\n"
        "2024-03-01 12:00:04 [INFO] recovered\n"
    )
    entries = parse_log(text)
    assert len(entries) == 2
    assert entries[0]["message"] == (
        "Unhandled exception\n"
        "Traceback (most recent call last):\n"
        '  File "app.py", line 10, in <module>\n'
        "    run()\n"
        "ValueError: bad"
    )
    assert entries[1]["message"] == "recovered"


def test_level_aliases_and_case():
    lines = [
        "2024-01-01 00:00:00 [debug] a",
        "2024-01-01 00:00:00 [Err] b",
        "2024-01-01 00:00:00 [CRIT] c",
        "2024-01-01 00:00:00 [fatal] d",
        "2024-01-01 00:00:00 [Warning] e",
        "2024-01-01 00:00:00 [critical] f",
    ]
    levels = [entry["level"] for entry in parse_log("\n".join(lines))]
    assert levels == ["DEBUG", "ERROR", "CRITICAL", "CRITICAL", "WARNING", "CRITICAL"]


def test_blank_lines_and_preamble_ignored():
    text = "log opened by rotate.sh\n\n2024-01-01 00:00:00 [INFO] start\n\n\n2024-01-01 00:00:01 [INFO] next\n"
    assert [entry["message"] for entry in parse_log(text)] == ["start", "next"]


def test_crlf_line_endings():
    text = "2024-01-01 00:00:00,5 [INFO] (t1) windows line \r\n  more\r\n"
    assert parse_log(text) == [
        {"timestamp": "2024-01-01T00:00:00.5", "level": "INFO", "thread": "t1", "message": "windows line\n  more"},
    ]


def test_six_digit_fraction_and_dot():
    entry = parse_log("2024-12-31T23:59:59.999999 [INFO] last\n")[0]
    assert entry["timestamp"] == "2024-12-31T23:59:59.999999"


def test_thread_names_with_spaces_and_dashes():
    entry = parse_log("2024-01-01 00:00:00 [INFO] (pool-1 thread-2) work done\n")[0]
    assert entry["thread"] == "pool-1 thread-2" and entry["message"] == "work done"


def test_message_with_brackets_and_parentheses():
    entry = parse_log("2024-01-01 00:00:00 [INFO] user (id 7) sent [payload]\n")[0]
    assert entry["thread"] is None
    assert entry["message"] == "user (id 7) sent [payload]"


def test_empty_text():
    assert parse_log("") == []
    assert parse_log("\n\n") == []


def test_trailing_whitespace_removed():
    entry = parse_log("2024-01-01 00:00:00 [INFO] padded   \t\n")[0]
    assert entry["message"] == "padded"
