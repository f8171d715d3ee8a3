"""What hostile or careless clients send, answered as the guide promises: every request parameter in
its documented range (422 naming it, never a 500), the new-token limit bounding whatever asks for
tokens, inputs the model cuts marked ``"truncated": true``, one error shape for every refusal (an
unknown route, a wrong method, a body that is not JSON, an image that cannot be decoded or is too
big), the API key checked before the body, an event loop that answers while a request is tokenized,
and metrics labelled by route templates, not by the paths clients invent."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import CAPTIONING, CLASSIFIER, TRANSLATION, SlowModel, client_for, config, png, refused

from scratchformer.serve import Limits, ModelSpec, ServeConfig, create_app
from scratchformer.serve.parameters import RANGES

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "serve.md"
LONG = "ein Mann " * 40  # more tokens than the fixture translator's max_len (64), fewer than max_input_tokens


@pytest.fixture(scope="module")
def client():
    specs = [
        ModelSpec("de-en", str(TRANSLATION)),
        ModelSpec("imdb", str(CLASSIFIER)),
        ModelSpec("shapes", str(CAPTIONING)),
    ]
    with client_for(config(*specs, max_new_tokens=20, max_wait_ms=1)) as c:
        yield c


def translate(client, parameters: dict[str, Any], inputs: Any = "ein Mann") -> httpx.Response:
    return client.post("/v1/translate", json={"inputs": inputs, "parameters": parameters})


# ------------------------------------------------------------------------ 1. parameters in their ranges


@pytest.mark.parametrize(
    ("parameters", "name"),
    [
        ({"num_beams": 10**9}, "num_beams"),
        ({"beam_size": 10**9}, "num_beams"),
        ({"num_return_sequences": 10**9, "do_sample": True}, "num_return_sequences"),
        ({"do_sample": True, "temperature": 1e-300}, "temperature"),
        ({"length_penalty": 1000}, "length_penalty"),
        ({"length_penalty": -1000}, "length_penalty"),
        ({"do_sample": True, "seed": 10**23}, "seed"),
        ({"do_sample": True, "seed": -1}, "seed"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"max_len_a": 10**400}, "max_len_a"),
        ({"top_k": 10**30, "do_sample": True}, "top_k"),
        ({"no_repeat_ngram_size": 10**12}, "no_repeat_ngram_size"),
        ({"top_p": 0}, "top_p"),
        ({"temperature": True}, "temperature"),
    ],
)
def test_a_parameter_out_of_its_range_is_422_naming_it(client, parameters, name) -> None:
    body = refused(translate(client, parameters), 422, f"parameters.{name} must be")
    assert len(body["error"]) < 300, body  # (a huge value is not echoed whole)


def test_a_lone_surrogate_is_422_naming_where_it_is(client) -> None:
    """JSON's "\\ud800" decodes to a string no tokenizer (and no UTF-8 answer) takes."""
    for body, where in [
        (b'{"inputs": ["ein Mann", "a \\ud800"]}', "inputs[1]"),
        (b'{"inputs": "ein Mann", "parameters": {"prefix": "\\udfff"}}', "parameters.prefix"),
    ]:
        answer = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
        refused(answer, 422, where, "not valid Unicode")
    answer = client.post(
        "/v1/classify", content=b'{"inputs": "\\ud800"}', headers={"content-type": "application/json"}
    )
    refused(answer, 422, "inputs[0]", "not valid Unicode")


@pytest.mark.parametrize(
    "parameters",
    [
        {"num_beams": 16, "num_return_sequences": 16, "length_penalty": -10},
        {"num_beams": 4, "length_penalty": 10, "repetition_penalty": 100, "no_repeat_ngram_size": 100},
        {
            "do_sample": True,
            "temperature": 0.01,
            "top_k": 1_000_000,
            "seed": 2**63 - 1,
            "num_return_sequences": 16,
        },
        {"do_sample": True, "temperature": 100, "top_p": 1e-300, "repetition_penalty": 0.01, "seed": 0},
        {"max_len_a": 100, "max_len_b": 100_000, "min_new_tokens": 19, "num_beams": 1},
        {"max_new_tokens": 20, "min_new_tokens": 19, "prefix": "A dog"},
    ],
)
def test_parameters_at_the_ends_of_their_ranges_are_answered(client, parameters) -> None:
    for stream in (False, True):
        body = {"inputs": ["ein Mann", LONG], "parameters": parameters, "stream": stream}
        answer = client.post("/v1/translate", json=body)
        assert answer.status_code == 200, answer.text
        assert "event: error" not in answer.text, answer.text
    captions = client.post(
        "/v1/caption",
        files=[("images", ("a.png", png(), "image/png"))],
        data={"parameters": json.dumps(parameters)},
    )
    if captions.status_code != 200:  # (the captioner's shorter max_len leaves no room for some)
        refused(captions, 422, "parameters")


def test_the_guide_gives_every_parameters_range() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    for name, allowed in RANGES.items():
        row = re.search(rf"^\| `{name}`[^|]*\| ([^|]+) \|", guide, re.MULTILINE)
        assert row is not None, f"the guide's table of parameters has no row for {name}"
        for end in (allowed.low, allowed.high):
            shown = str(end) if isinstance(end, int) else f"{end:g}"
            assert shown in row.group(1), (name, shown, row.group(1))


# ---------------------------------------------------------------- 2. the limit bounds the effective work


def test_min_new_tokens_past_the_new_token_limit_is_refused(client) -> None:
    """With max_new_tokens=20, asking for 40 at least (and a budget of 60) is a 422, not 43 tokens."""
    refused(
        translate(client, {"min_new_tokens": 40, "max_len_b": 60}), 422, "min_new_tokens", "max_new_tokens=20"
    )
    refused(translate(client, {"min_new_tokens": 10, "max_len_a": 0, "max_len_b": 5}), 422, "min_new_tokens")


@pytest.mark.parametrize("budget", [{"max_len_b": 60}, {"max_len_a": 50}])
def test_a_budget_past_the_new_token_limit_is_cut_to_it(client, budget) -> None:
    """With max_new_tokens=20, a budget a * S + b over it decodes 20 new tokens at most (this model
    runs on to its budget once min_new_tokens has held EOS back)."""
    answers = translate(client, {"min_new_tokens": 19, **budget}, "ein Mann " * 10).json()
    assert all(len(a["tokens"]) + 1 <= 20 for a in answers), answers  # (tokens: without the EOS)


# -------------------------------------------------------------------------------- 3. inputs that are cut


def test_an_input_the_model_cuts_is_marked_truncated(client) -> None:
    answers = client.post("/v1/translate", json={"inputs": [LONG, "ein Mann"]}).json()
    assert answers[0]["truncated"] is True and "truncated" not in answers[1]  # (as the command line's JSON)
    answers = client.post("/v1/classify", json={"inputs": ["great " * 100, "bad"]}).json()
    assert answers[0]["truncated"] is True and "truncated" not in answers[1]
    events = client.post("/v1/translate", json={"inputs": [LONG], "stream": True}).text
    assert '"index": 0' in events and '"truncated": true' in events


# ------------------------------------------------------------------------------------- 4. one error shape


def test_unknown_routes_and_wrong_methods_answer_in_the_error_shape(client) -> None:
    refused(client.get("/v1/nope"), 404, "not found", "/v1/nope")
    refused(client.post("/nope", json={}), 404, "not found")
    answer = client.get("/v1/translate")
    refused(answer, 405, "GET", "/v1/translate", "POST")
    assert answer.headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("path", "send", "said"),
    [
        ("/v1/translate", {"content": b"ein Mann", "headers": {"content-type": "text/plain"}}, "text/plain"),
        ("/v1/translate", {"data": {"inputs": "ein Mann"}}, "application/x-www-form-urlencoded"),
        ("/v1/translate", {"content": b'{"inputs": "x"}'}, "no Content-Type"),
        ("/v1/caption", {"json": {"images": []}}, "application/json"),
    ],
)
def test_a_body_of_another_type_is_415_naming_it(client, path, send, said) -> None:
    expected = "multipart/form-data" if path == "/v1/caption" else "application/json"
    refused(client.post(path, **send), 415, said, expected)


def test_an_image_that_fails_to_decode_is_named_by_its_upload(client) -> None:
    whole = png(90, 70)
    files = [
        ("images", ("fine.png", png(), "image/png")),
        ("images", ("cut.png", whole[: len(whole) // 2], "image/png")),
    ]
    body = refused(client.post("/v1/caption", files=files), 422, "images[1] (cut.png)")
    assert "_io" not in body["error"] and "0x" not in body["error"], body


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels and holds none (what a header check reads)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


def test_an_image_past_the_pixel_limit_is_413_even_past_pillows_bound(client) -> None:
    """Pillow refuses to open 20000 x 20000 at all (a decompression bomb): still the documented 413."""
    for size in (7000, 20000):  # over max_image_pixels (40 M); over Pillow's bound (179 M) too
        files = [("images", ("big.png", png_header(size, size), "image/png"))]
        refused(
            client.post("/v1/caption", files=files), 413, "images[0] (big.png)", "max_image_pixels=40000000"
        )


# ----------------------------------------------------------------------- 5. the key before the body


def test_without_the_key_every_body_is_401(tmp_path: Path) -> None:
    spec, limits = ModelSpec("slow", str(tmp_path)), Limits(max_body_bytes=1000)
    with client_for(ServeConfig([spec], api_key="s3cret", limits=limits), [SlowModel("slow", tmp_path)]) as c:
        json_type = {"content-type": "application/json"}
        for send in (
            {"content": b"{not json", "headers": json_type},
            {"content": b"hello", "headers": {"content-type": "text/plain"}},
            {"content": b'{"inputs": "' + b"x" * 5000 + b'"}', "headers": json_type},  # over max_body_bytes
            {"json": {"inputs": []}},
        ):
            refused(c.post("/v1/classify", **send), 401, "Authorization: Bearer")
        refused(c.get("/v1/nope"), 401)  # (what /v1/ holds is not told either)
        key = {**json_type, "Authorization": "Bearer s3cret"}
        refused(c.post("/v1/classify", content=b"{not json", headers=key), 422, "not valid JSON")
        assert c.get("/health").status_code == 200


# --------------------------------------------------------------------------- 6. the event loop is free


class SlowTokenizer(SlowModel):
    """A model whose tokenizing takes until ``release`` is set (as 10 MB of text does)."""

    def __init__(self, name: str, path: Path):
        super().__init__(name, path)
        self.tokenizing, self.release = threading.Event(), threading.Event()

    def lengths(self, items: list[str]) -> list[int]:
        self.tokenizing.set()
        self.release.wait(10)
        return super().lengths(items)


def test_the_event_loop_answers_while_a_request_is_tokenized(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    model = SlowTokenizer("slow", tmp_path)
    app = create_app(config(ModelSpec("slow", str(tmp_path))), [model])
    moments: dict[str, float] = {}

    def release() -> None:
        moments.setdefault("released", time.monotonic())
        model.release.set()

    async def scenario() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            big = asyncio.ensure_future(http.post("/v1/classify", json={"inputs": "a long text"}))
            while not model.tokenizing.is_set():
                await asyncio.sleep(0.01)
            health = await http.get("/health")  # while the text is being tokenized
            moments["health"] = time.monotonic()
            release()
            return health.status_code, (await big).status_code

    with TestClient(app):
        app.state.serve.done_loading.wait(30)
        timer = threading.Timer(2.0, release)  # (on an event loop that tokenizes, nothing else runs)
        timer.start()
        codes = asyncio.run(scenario())
        timer.cancel()
    assert codes == (200, 200)
    assert moments["health"] < moments["released"], "/health waited for the tokenizing to end"


# ------------------------------------------------------------------------------------- 7. metric labels


def test_metrics_are_labelled_by_route_template_not_by_path(tmp_path: Path) -> None:
    with client_for(config(ModelSpec("slow", str(tmp_path))), [SlowModel("slow", tmp_path)]) as c:
        assert c.post("/v1/classify", json={"inputs": "x"}).status_code == 200
        assert c.get("/v1/classify").status_code == 405
        before = len(c.get("/metrics").text)
        for i in range(50):
            assert c.get(f"/v1/made-up-{i}").status_code == 404
        text = c.get("/metrics").text
    assert "made-up" not in text
    assert 'scratchformer_requests_total{code="404",endpoint="unmatched",model="-"} 50.0' in text
    assert 'scratchformer_requests_total{code="200",endpoint="/v1/classify",model="slow"} 1.0' in text
    assert 'endpoint="/v1/classify",model="-"} 1.0' in text  # (the 405: its route's template)
    assert len(text) - before < 4000  # one label's lines, not fifty
