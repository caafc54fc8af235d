import time

from solution import LRUCache


def test_basic_put_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1 and cache.get("b") == 2
    assert len(cache) == 2


def test_missing_key_default():
    cache = LRUCache(1)
    assert cache.get("nope") is None
    assert cache.get("nope", 42) == 42


def test_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache and "b" in cache and "c" in cache
    assert cache.evictions == 1


def test_get_counts_as_a_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache


def test_put_existing_key_counts_as_a_use_and_replaces():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10 and "b" not in cache
    assert len(cache) == 2 and cache.evictions == 1


def test_contains_is_not_a_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache
    cache.put("c", 3)
    assert "a" not in cache and "b" in cache


def test_none_is_a_value():
    cache = LRUCache(2)
    cache.put("k", None)
    assert "k" in cache and cache.get("k", "default") is None


def test_capacity_one_and_invalid():
    cache = LRUCache(1)
    cache.put(1, "x")
    cache.put(2, "y")
    assert 1 not in cache and cache.get(2) == "y" and cache.evictions == 1
    for bad in (0, -3):
        try:
            LRUCache(bad)
        except ValueError:
            continue
        raise AssertionError(f"LRUCache({bad}) did not raise ValueError")


def test_tuple_keys():
    cache = LRUCache(3)
    cache.put(("a", 1), "first")
    assert cache.get(("a", 1)) == "first"


def test_many_operations_against_a_model():
    cache = LRUCache(5)
    model = []  # keys, least recently used first
    values = {}
    for step in range(2000):
        key = (step * 7919) % 13
        if step % 3:
            cache.put(key, step)
            if key in model:
                model.remove(key)
            elif len(model) == 5:
                values.pop(model.pop(0))
            model.append(key)
            values[key] = step
        else:
            expected = values.get(key)
            assert cache.get(key) == expected, (step, key)
            if key in model:
                model.remove(key)
                model.append(key)
        assert len(cache) == len(model)


def test_constant_time_operations():
    cache = LRUCache(200_000)
    began = time.process_time()
    for number in range(300_000):
        cache.put(number, number)
        cache.get(number - 1000)
    assert time.process_time() - began < 5, "get/put are not constant time"
    assert cache.evictions == 100_000 and len(cache) == 200_000
