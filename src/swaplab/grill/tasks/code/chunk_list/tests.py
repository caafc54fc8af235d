from solution import chunk_list


def expect_value_error(items, size):
    try:
        chunk_list(items, size)
    except ValueError:
        return
    raise AssertionError(f"chunk_list({items!r}, {size!r}) did not raise ValueError")


def test_even_split():
    assert chunk_list([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_shorter_last_chunk():
    assert chunk_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_size_larger_than_list():
    assert chunk_list([1, 2], 5) == [[1, 2]]


def test_size_one():
    assert chunk_list(["a", "b"], 1) == [["a"], ["b"]]


def test_empty():
    assert chunk_list([], 3) == []


def test_invalid_size():
    expect_value_error([1, 2], 0)
    expect_value_error([1, 2], -2)
    expect_value_error([], 0)


def test_chunks_are_new_lists():
    items = [1, 2, 3]
    chunks = chunk_list(items, 3)
    chunks[0].append(4)
    assert items == [1, 2, 3]
