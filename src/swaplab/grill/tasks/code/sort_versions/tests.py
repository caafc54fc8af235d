import random

from solution import sort_versions

SPEC_ORDER = [
    "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
    "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0",
]


def expect_value_error(versions):
    try:
        result = sort_versions(versions)
    except ValueError:
        return
    raise AssertionError(f"sort_versions({versions!r}) returned {result!r} instead of raising ValueError")


def test_numeric_not_textual():
    assert sort_versions(["1.10.0", "1.2.0", "1.9.3", "10.0.0", "2.0.0"]) == ["1.2.0", "1.9.3", "1.10.0", "2.0.0", "10.0.0"]


def test_the_specification_example():
    shuffled = SPEC_ORDER[:]
    random.Random(3).shuffle(shuffled)
    assert sort_versions(shuffled) == SPEC_ORDER


def test_prerelease_before_release():
    assert sort_versions(["2.0.0", "2.0.0-rc.1", "1.9.9"]) == ["1.9.9", "2.0.0-rc.1", "2.0.0"]


def test_numeric_identifier_before_text():
    assert sort_versions(["1.0.0-a", "1.0.0-9", "1.0.0-10"]) == ["1.0.0-9", "1.0.0-10", "1.0.0-a"]


def test_ascii_order_of_text_identifiers():
    assert sort_versions(["1.0.0-beta", "1.0.0-Beta", "1.0.0-alpha-2"]) == ["1.0.0-Beta", "1.0.0-alpha-2", "1.0.0-beta"]


def test_build_metadata_ignored_and_stable():
    versions = ["1.0.0+build.2", "0.9.0", "1.0.0+build.1", "1.0.0"]
    assert sort_versions(versions) == ["0.9.0", "1.0.0+build.2", "1.0.0+build.1", "1.0.0"]


def test_leading_v_kept():
    assert sort_versions(["v1.2.3", "1.2.2", "v0.1.0"]) == ["v0.1.0", "1.2.2", "v1.2.3"]


def test_empty_list():
    assert sort_versions([]) == []


def test_input_not_modified():
    versions = ["2.0.0", "1.0.0"]
    sort_versions(versions)
    assert versions == ["2.0.0", "1.0.0"]


def test_invalid_versions():
    for bad in ("1.2", "1.2.x", "01.2.3", "1.2.3-", "1.2.3-a..b", "", "1.2.3.4", "v", "1.2.3+"):
        expect_value_error(["1.0.0", bad])
