"""Bad input over real HTTP: bodies the router cannot read, Content-Types it must not read, numbers out of range.

Each answer is a 400 (or a 415 for the Content-Type) that says what is wrong, never a 500
and never a misleading "names no model".
"""

from __future__ import annotations

import aiohttp
import pytest

from conftest import write_config
from procs import SIM, Router, eventually

CONFIG = f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
    filters:
      setParams: {{top_p: 0.5}}
"""

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """One router for every case here: none of them changes its state."""
    directory = tmp_path_factory.mktemp("bad-input")
    router = Router(write_config(directory, CONFIG), directory)
    yield router
    router.close()


async def send(url: str, method: str, path: str, body: bytes | None = None, content_type: str | None = None):
    """The status and the error message of one request; `content_type` None sends no Content-Type at all."""
    headers = {"Content-Type": content_type} if content_type is not None else {}
    # aiohttp labels a bytes body application/octet-stream unless told: skip_auto_headers keeps it bare.
    async with aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as session:
        async with session.request(method, url + path, data=body, headers=headers) as response:
            document = await response.json(content_type=None)
            return response.status, document["error"]["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"a": 1 "model": "a"}', "the body is not valid JSON: Expecting ',' delimiter at line 1 column 9"),
        (b'{"model": "a"', "the body is not valid JSON: Expecting ',' delimiter at line 1 column 14"),
        (b"   ", "the body is not valid JSON: Expecting value at line 1 column 4"),
        (b'{"model": "a\xff"}', "the body is not UTF-8 (byte 0xff at offset 12)"),
        ('{"model": "a"}'.encode("utf-16"), "the body is not UTF-8 (byte 0xff at offset 0)"),
        (b'{"model": "a", "seed": ' + b"9" * 5000 + b"}", "a number in the body is too large (more than 4300 digits)"),
        (b"[" * 1100 + b"]" * 1100, "the body nests deeper than 1024 levels"),
        (b'{"model": "a", "x": ' + b'{"y": ' * 2000 + b"1" + b"}" * 2001, "the body nests deeper than 1024 levels"),
        (b'{"model": "a", "t": NaN, "x": "\\ud800"}', "the body holds a lone UTF-16 surrogate escape"),
    ],
)
async def test_an_unreadable_json_body_is_a_400_that_says_why(router, body, message):
    for content_type in ("application/json", "application/json; charset=utf-8", None):
        status, said = await send(router.url, "POST", CHAT, body, content_type)
        assert (status, said[: len(message)]) == (400, message), content_type


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=UTF-8",
                                          "application/vnd.api+json", None])
async def test_json_is_read_under_a_json_type_or_none(router, content_type):
    # An unknown name proves the body was read: a body left unread would name no model.
    status, said = await send(router.url, "POST", CHAT, b'{"model": "nosuch"}', content_type)
    assert status == 404 and said.startswith("model 'nosuch' not found")


async def test_a_json_body_without_a_content_type_reaches_its_model(router):
    async with aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as session:
        body = b'{"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        async with session.post(router.url + CHAT, data=body) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["model"] == "a"


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8", "application/octet-stream",
                                          "application/xml", "json"])
async def test_a_body_of_another_content_type_is_a_415_naming_it(router, content_type):
    # A browser posts text/plain to another site without asking first: it must never be read as JSON.
    status, said = await send(router.url, "POST", CHAT, b'{"model": "a", "messages": []}', content_type)
    media = content_type.split(";")[0].lower()
    assert status == 415 and said.startswith(f"the body's Content-Type is {media}, which this route does not read")
    assert "send JSON as application/json" in said


@pytest.mark.parametrize("body", [b'{"model": "a", "messages": []}', b'  [{"model": "a"}]'])
async def test_curl_d_json_is_told_to_say_application_json(router, body):
    status, said = await send(router.url, "POST", CHAT, body, "application/x-www-form-urlencoded")
    assert status == 415 and "-H 'Content-Type: application/json'" in said


async def test_forms_still_name_their_model(router):
    status, said = await send(router.url, "POST", CHAT, b"model=nosuch&prompt=hi", "application/x-www-form-urlencoded")
    assert status == 404 and said.startswith("model 'nosuch' not found")
    form = (b'--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nnosuch\r\n--XyZ--\r\n')
    status, said = await send(router.url, "POST", "/v1/audio/transcriptions", form, "multipart/form-data; boundary=XyZ")
    assert status == 404 and said.startswith("model 'nosuch' not found")
    # A body with no model and no ?model= still says so.
    status, said = await send(router.url, "POST", CHAT, b"prompt=hi", "application/x-www-form-urlencoded")
    assert status == 400 and said.startswith("the request names no model")


@pytest.mark.parametrize("path", ["/api/activity", "/logs", "/logs/stream"])
@pytest.mark.parametrize("limit", ["abc", "0", "-3", "1.5", "100001", "9" * 30, "\uff15"])
async def test_a_limit_that_is_no_whole_number_in_range_is_a_400(router, path, limit):
    status, said = await send(router.url, "GET", f"{path}?limit={limit}")
    assert (status, said) == (400, f"limit must be a whole number from 1 to 100000, not {limit!r}")


@pytest.mark.parametrize("path", ["/api/activity", "/logs"])
async def test_a_limit_in_range_or_empty_is_taken(router, path):
    for query in ("?limit=1", "?limit=100000", "?limit=", "?limit=%2B5"):
        async with aiohttp.ClientSession() as session:
            async with session.get(router.url + path + query) as response:
                assert response.status == 200, (query, await response.text())


@pytest.mark.parametrize("capture_id", ["9" * 30, str(2**63), "1.0", "\uff15"])
async def test_a_capture_id_past_go_s_int_is_llama_swap_s_400(router, capture_id):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/api/captures/{capture_id}") as response:
            assert response.status == 400
            assert (await response.json())["error"]["message"] == "invalid capture ID"
        async with session.get(f"{router.url}/api/captures/{2**63 - 1}") as response:
            assert response.status == 404  # the largest id there can be is looked for, and not found


async def test_a_profile_request_nested_past_reading_is_llama_swap_s_400(router):
    async with aiohttp.ClientSession() as session:
        body = b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        async with session.put(f"{router.url}/api/profiles/active", data=body) as response:
            assert response.status == 400
            assert (await response.json())["error"]["message"] == "invalid profile request"


async def test_a_body_too_deep_to_rewrite_for_its_model_is_a_400(router):
    # Read (orjson reads 1024 levels) but not written again with the model's filters: json writes fewer.
    body = b'{"model": "a", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    status, said = await send(router.url, "POST", CHAT, body, "application/json")
    assert (status, said) == (400, "the body nests too deeply to be rewritten for its model (filters, its name)")
    chat = b'{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "x": '
    body = chat + b"[" * 500 + b"]" * 500 + b"}"  # past what orjson writes, within json's reach
    async with aiohttp.ClientSession() as session:
        async with session.post(router.url + CHAT, data=body, headers={"Content-Type": "application/json"}) as response:
            assert response.status == 200, await response.text()


@pytest.mark.parametrize("flight_id", ["\u00b2", "9" * 30, "-1", "x"])
async def test_an_in_flight_id_that_is_no_whole_number_is_not_found(router, flight_id):
    # `²` passes str.isdigit and fails int(): it was a 500.
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/api/inflight/{flight_id}/cancel") as response:
            assert response.status == 404
            assert (await response.json())["error"]["message"] == "inflight request not found"


async def test_a_request_aiohttp_refuses_is_one_line_in_the_log_not_a_traceback(router):
    before = len(router.output())
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/{'x' * 9000}") as response:
            assert response.status == 400  # aiohttp's: past its 8190 bytes of request line
    await eventually(lambda: "refused a malformed request" in router.output()[before:], 10, "the router's line")
    added = router.output()[before:]
    assert "Traceback" not in added and "Error handling request" not in added, added


async def test_a_form_labelled_body_reaches_the_model_as_it_is_and_the_sim_refuses_it(router):
    # A multipart label is not read as JSON: the body goes to the model as sent, and a body nested
    # past json's reach is the sim's 400, not its 500.
    body = b'{"model": "a", "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    status, said = await send(router.url, "POST", "/v1/completions?model=a", body, "multipart/form-data; boundary=")
    assert (status, said) == (400, "invalid JSON body: nested deeper than json reads")
