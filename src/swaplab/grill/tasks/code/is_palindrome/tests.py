from solution import is_palindrome


def test_classic_sentence():
    assert is_palindrome("A man, a plan, a canal: Panama") is True


def test_not_a_palindrome():
    assert is_palindrome("race a car") is False


def test_empty_and_symbols_only():
    assert is_palindrome("") is True
    assert is_palindrome(".,!? ") is True


def test_quotes_and_case():
    assert is_palindrome("No 'x' in Nixon") is True


def test_digits_count():
    assert is_palindrome("12321") is True
    assert is_palindrome("123 21") is True
    assert is_palindrome("1231") is False


def test_letters_and_digits_mixed():
    assert is_palindrome("a1b1a") is True
    assert is_palindrome("a1b2a") is False


def test_two_characters():
    assert is_palindrome("ab") is False
    assert is_palindrome("Aa") is True


def test_unicode_letters():
    assert is_palindrome("Été") is True
    assert is_palindrome("Ésope reste ici et se repose") is False
