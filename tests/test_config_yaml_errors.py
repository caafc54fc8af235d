"""YAML syntax errors at the line of the mistake, in plain words (config/yamlerrors.py).

Each row is a real mistake in an otherwise good config, the line a person would blame and
what the fault says. PyYAML itself gives up later for most of them (`pyyaml_line`): the
end of the file for an unclosed quote, the next key for an unclosed bracket; the rows
assert it does, so each one would fail against a loader that reports PyYAML's line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from configtext import faults_of

SWAPLAB = Path(sys.executable).parent / "swaplab"

GOOD_TAIL = "  b:\n    cmd: llama-server --port ${PORT}\n"

# (why, text, line of the mistake, PyYAML's own line, the fault's words after `invalid YAML: `)
MISTAKES = [
    ("an unclosed double quote",
     'models:\n  a:\n    cmd: "llama-server --port ${PORT}\n    ttl: 5\n' + GOOD_TAIL, 3, 7,
     'the quote " at column 10 is never closed; add the closing " where the value ends'),
    ("an unclosed single quote",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    name: 'it\n" + GOOD_TAIL, 4, 7,
     "the quote ' at column 11 is never closed; add the closing ' where the value ends"),
    ("an unclosed quote that a later quote closes",
     'models:\n  a:\n    cmd: "llama-server --port ${PORT}\n    ttl: 5\n  b:\n    cmd: "x"\n', 3, 6,
     'the quote " at column 10 is not closed on this line, so the value runs on to line 6; '
     'add the closing " where the value ends'),
    ("an unclosed [",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    aliases: [one, two\n    ttl: 5\n" + GOOD_TAIL, 4, 5,
     "the list opened with '[' at column 14 is never closed; add the ']' (YAML read on to line 5 looking for it)"),
    ("an unclosed { at the end of the file",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    metadata: {size: 1\n", 4, 5,
     "the mapping opened with '{' at column 15 is never closed; add the '}' (the file ends inside it)"),
    ("a tab in the indentation",
     "models:\n  a:\n\tcmd: llama-server --port ${PORT}\n" + GOOD_TAIL, 3, 3,
     "a tab indents this line; YAML indents with spaces only"),
    ("a tab after a key's colon",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    ttl:\t5\n" + GOOD_TAIL, 4, 4,
     "a tab at column 9, where YAML takes only spaces; write a space"),
    ("a key indented one space too far",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n     ttl: 5\n" + GOOD_TAIL, 4, 4,
     "'ttl:' is indented more than the line above it, so YAML reads it as more of that line's value; "
     "indent it as the keys beside it"),
    ("a key indented one space too little",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n   ttl: 5\n" + GOOD_TAIL, 4, 4,
     "this line's indentation (3 spaces) fits no level of the block that starts at line 2; "
     "indent it as the lines it belongs with"),
    ("a key without its colon",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    ttl 5\n    name: a\n" + GOOD_TAIL, 4, 5,
     "'ttl 5' is no `key: value`: add the ':' after the key (or, if it continues the value above, "
     "indent it as that value)"),
    ("a value holding ': '",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    name: qwen: the big one\n" + GOOD_TAIL, 4, 4,
     "a second ': ' on this line (column 15); put the value in quotes if it holds ': '"),
    ("text after a quoted value",
     'models:\n  a:\n    cmd: llama-server --port ${PORT}\n    name: "qwen" big\n' + GOOD_TAIL, 4, 4,
     "text after the value's closing quote (column 18); put the whole value in quotes"),
    ("a list item where a key belongs",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    aliases:\n    - one\n    name: a\n    - two\n"
     + GOOD_TAIL, 7, 7,
     "a list item where the mapping that starts at line 3 wants a key; indent the item under its key"),
    ("a bracket that closes nothing",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    metadata: {size: 1}}\n" + GOOD_TAIL, 4, 4,
     "a '}' that closes nothing; remove it"),
    ("a value starting with a reserved character",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    name: @home\n" + GOOD_TAIL, 4, 4,
     "a value cannot start with '@' unquoted (column 11); put the value in quotes"),
    ("an escape double quotes do not know",
     'models:\n  a:\n    cmd: "llama-server --port ${PORT} -m C:\\models\\q.gguf"\n' + GOOD_TAIL, 3, 3,
     "'\\m' (column 44) is no escape YAML knows in double quotes; write '\\\\m' for a backslash, "
     "or quote the value with ' instead"),
    ("an alias with no anchor",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    env: *common\n" + GOOD_TAIL, 4, 4,
     "'*common' refers to no anchor: no '&common' is defined before it"),
    ("a second document",
     "models:\n  a:\n    cmd: llama-server --port ${PORT}\n---\nmodels: {}\n", 4, 4,
     "a second YAML document starts here ('---'); a config file is one document"),
]


@pytest.mark.parametrize(
    ("text", "line", "pyyaml_line", "message"), [row[1:] for row in MISTAKES], ids=[row[0] for row in MISTAKES]
)
def test_a_yaml_mistake_is_reported_at_its_line_in_plain_words(text, line, pyyaml_line, message):
    with pytest.raises(yaml.MarkedYAMLError) as raised:
        yaml.safe_load(text)
    assert raised.value.problem_mark.line + 1 == pyyaml_line
    assert faults_of(text) == [(line, "invalid YAML: " + message)]


def test_a_list_written_over_lines_is_blamed_where_it_goes_wrong():
    """A bracket left open is only blamed once the lines after it go back to its indentation;
    inside a list written over several lines, the fault is at the line that breaks it."""
    text = "models:\n  a:\n    cmd: llama-server --port ${PORT}\n    aliases: [one,\n      two: x: y]\n"
    assert faults_of(text) == [
        (5, "invalid YAML: the list opened at line 4 wants ',' or its closing bracket at column 13, found ':'; "
            "put a value that holds ': ' or ',' in quotes")
    ]


def test_config_check_prints_file_and_line_of_the_mistake(tmp_path):
    config = tmp_path / "swaplab.yaml"
    config.write_text('models:\n  a:\n    cmd: "llama-server --port ${PORT}\n    ttl: 5\n' + GOOD_TAIL)
    result = subprocess.run(
        [str(SWAPLAB), "config", "check", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stdout == (
        f'{config}:3: invalid YAML: the quote " at column 10 is never closed; add the closing " where the value ends\n'
    )
