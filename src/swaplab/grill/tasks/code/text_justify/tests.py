from solution import text_justify


def test_example():
    words = ["This", "is", "an", "example", "of", "text", "justification."]
    assert text_justify(words, 16) == ["This    is    an", "example  of text", "justification.  "]


def test_uneven_gaps_favour_the_left():
    words = ["What", "must", "be", "acknowledgment", "shall", "be"]
    assert text_justify(words, 16) == ["What   must   be", "acknowledgment  ", "shall be        "]


def test_longer_text():
    words = [
        "Science", "is", "what", "we", "understand", "well", "enough", "to", "explain", "to",
        "a", "computer.", "Art", "is", "everything", "else", "we", "do",
    ]
    assert text_justify(words, 20) == [
        "Science  is  what we",
        "understand      well",
        "enough to explain to",
        "a  computer.  Art is",
        "everything  else  we",
        "do                  ",
    ]


def test_no_words():
    assert text_justify([], 10) == []


def test_single_word_exact_width():
    assert text_justify(["abcde"], 5) == ["abcde"]


def test_single_word_lines_are_left_justified():
    assert text_justify(["longword", "another"], 9) == ["longword ", "another  "]


def test_last_line_single_spaces():
    assert text_justify(["a", "b", "c"], 10) == ["a b c     "]


def test_every_line_has_the_width():
    words = "the quick brown fox jumps over the lazy dog again and again".split()
    for width in range(5, 30):
        lines = text_justify(words, width)
        assert all(len(line) == width for line in lines), width
        assert " ".join(" ".join(lines).split()) == " ".join(words), width


def test_three_gaps_two_extra():
    assert text_justify(["a", "b", "c", "d", "last"], 9) == ["a  b  c d", "last     "]
