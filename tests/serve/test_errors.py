"""Every refusal the server makes, each with its status code and a one-line error naming the
problem: 400, 401, 404, 413, 422, 429 (with Retry-After), 503, 504; queued work of a request whose
deadline passed or whose client went away is dropped, never computed; CORS is off unless asked;
nothing a client sends reaches a file."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
from servers import (
    CLASSIFIER,
    SOURCES,
    TRANSLATION,
    SlowModel,
    client_for,
    client_for_app,
    config,
    png,
    refused,
)

from scratchformer.serve import Limits, ModelSpec, ServeConfig, create_app


@pytest.fixture(scope="module")
def translator():
    with client_for(
        config(ModelSpec("de-en", str(TRANSLATION)), max_items=4, max_input_tokens=12, max_new_tokens=20,
               max_image_pixels=1000, max_body_bytes=2000)
    ) as c:  # fmt: skip
        yield c


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"inputs": []}, ["inputs: empty"]),
        ({"inputs": ["a", " "]}, ["inputs[1] is empty"]),
        ({"inputs": ["a"] * 5}, ["max_items=4"]),
        ({"inputs": "ein Mann " * 20}, ["inputs[0] has", "max_input_tokens=12"]),
        (
            {"inputs": "x", "parameters": {"beams": 2}},
            ["unknown key 'beams'; did you mean num_beams or beam_size?"],
        ),
        ({"inputs": "x", "parameters": {"num_beams": 0}}, ["num_beams must be an integer >= 1"]),
        ({"inputs": "x", "parameters": {"max_new_tokens": 21}}, ["max_new_tokens=20"]),
        ({"inputs": "x", "parameters": {"seed": 1}}, ["seed: only with do_sample"]),
        ({"inputs": 3}, ["inputs"]),
        ({"text": "x"}, ["inputs: Field required", "text: Extra inputs"]),
    ],
)
def test_bad_requests_are_422_naming_the_problem(translator, body, words) -> None:
    refused(translator.post("/v1/translate", json=body), 422, *words)


def test_models_that_do_not_fit_the_request(translator) -> None:
    refused(
        translator.post("/v1/translate", json={"inputs": "x", "model": "nope"}), 404, "no model named 'nope'"
    )
    refused(translator.post("/v1/classify", json={"inputs": "x"}), 404, "no loaded model answers it")
    refused(translator.post("/v1/translate", json={"inputs": "x", "model": "de-en", "x": 1}), 422, "x: Extra")


def test_two_models_of_a_kind_must_be_named(tmp_path: Path) -> None:
    specs = [ModelSpec("a", str(tmp_path)), ModelSpec("b", str(tmp_path))]
    with client_for(config(*specs), [SlowModel("a", tmp_path), SlowModel("b", tmp_path)]) as c:
        refused(c.post("/v1/classify", json={"inputs": "x"}), 400, "name one of ['a', 'b']")
        assert c.post("/v1/classify", json={"inputs": "x", "model": "b"}).status_code == 200


def test_bodies_and_images_over_their_limits_are_413(translator) -> None:
    refused(translator.post("/v1/translate", json={"inputs": "x" * 3000}), 413, "max_body_bytes=2000")

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"inputs": "'
        for _ in range(30):
            yield b"x" * 100
        yield b'"}'

    refused(
        translator.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"}), 413
    )
    # (the image checks come before the model's kind is looked at)
    refused(
        translator.post("/v1/caption", files=[("images", ("b.png", png(40, 30), "image/png"))]), 413, "40x30"
    )
    refused(
        translator.post("/v1/caption", files=[("images", ("t.txt", b"not an image", "text/plain"))]),
        422,
        "t.txt",
    )


def test_an_api_key_is_required_and_compared(tmp_path: Path) -> None:
    spec = ModelSpec("slow", str(tmp_path))
    with client_for(ServeConfig([spec], api_key="s3cret"), [SlowModel("slow", tmp_path)]) as c:
        response = c.post("/v1/classify", json={"inputs": "x"})
        refused(response, 401, "Authorization: Bearer")
        assert response.headers["www-authenticate"] == "Bearer"
        refused(c.post("/v1/classify", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"}), 401)
        ok = c.post("/v1/classify", json={"inputs": "x"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and c.get("/health").status_code == 200  # status routes stay open


def test_a_full_queue_is_429_with_retry_after(tmp_path: Path) -> None:
    model = SlowModel("slow", tmp_path)
    with client_for(config(ModelSpec("slow", str(tmp_path)), max_queue=2, max_batch_size=1), [model]) as c:
        model.gate.clear()  # the model holds its first batch; the queue fills behind it

        async def burst():
            transport = httpx.ASGITransport(app=c.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                sent = [
                    asyncio.ensure_future(http.post("/v1/classify", json={"inputs": f"x{i}"}))
                    for i in range(6)
                ]
                await asyncio.sleep(0.5)
                model.gate.set()
                return await asyncio.gather(*sent)

        answers = asyncio.run(burst())
    codes = sorted(r.status_code for r in answers)
    assert codes.count(429) >= 2 and set(codes) == {200, 429}, codes  # every request answered
    tired = next(r for r in answers if r.status_code == 429)
    assert tired.headers["retry-after"] == "1" and "max_queue 2" in tired.json()["error"]


def test_too_many_requests_in_flight_is_429(tmp_path: Path) -> None:
    model = SlowModel("slow", tmp_path)
    app = create_app(config(ModelSpec("slow", str(tmp_path)), max_concurrency=2), [model])
    with client_for_app(app):
        model.gate.clear()
        answers = asyncio.run(_burst(app, model, 4))
    assert sorted(r.status_code for r in answers) == [200, 200, 429, 429]


async def _burst(app, model: SlowModel, n: int) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        sent = [asyncio.ensure_future(http.post("/v1/classify", json={"inputs": f"x{i}"})) for i in range(n)]
        await asyncio.sleep(0.3)
        model.gate.set()
        return await asyncio.gather(*sent)


def test_past_its_deadline_a_request_is_504_and_its_queued_inputs_are_dropped(tmp_path: Path) -> None:
    model = SlowModel("slow", tmp_path)
    with client_for(config(ModelSpec("slow", str(tmp_path)), timeout_s=0.5, max_batch_size=1), [model]) as c:
        model.gate.clear()
        result = {}
        first = threading.Thread(
            target=lambda: result.setdefault("a", c.post("/v1/classify", json={"inputs": "first"}))
        )
        first.start()
        time.sleep(0.1)
        late = c.post("/v1/classify", json={"inputs": ["second", "third"]})
        refused(late, 504, "timeout_s")
        model.gate.set()
        first.join()
        time.sleep(0.3)
        assert model.batches == [["first"]]  # "second" and "third" were never computed
        assert 'scratchformer_dropped_inputs_total{model="slow",reason="deadline"}' in c.get("/metrics").text


def test_a_client_that_disconnects_has_its_queued_work_dropped(tmp_path: Path) -> None:
    model = SlowModel("slow", tmp_path)
    app = create_app(config(ModelSpec("slow", str(tmp_path)), max_batch_size=1), [model])

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            model.gate.clear()
            holder = asyncio.ensure_future(http.post("/v1/classify", json={"inputs": "first"}))
            await asyncio.sleep(0.2)
            gone = asyncio.ensure_future(http.post("/v1/classify", json={"inputs": "abandoned"}))
            await asyncio.sleep(0.2)
            gone.cancel()  # the client gives up: the app's receive() now says http.disconnect
            await asyncio.sleep(0.2)
            model.gate.set()
            await holder

    with client_for_app(app):
        asyncio.run(scenario())
        time.sleep(0.3)
    assert model.batches == [["first"]]


def test_not_ready_is_503_and_a_failed_load_says_why(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    (tmp_path / "config.json").write_text('{"kind": "a_kind_nobody_serves"}')
    app = create_app(config(ModelSpec("odd", str(tmp_path))))
    with TestClient(app) as c:
        app.state.serve.done_loading.wait(30)
        body = c.get("/ready").json()
        assert c.get("/ready").status_code == 503 and body["status"] == "failed"
        assert "a_kind_nobody_serves" in body["error"] and "cannot be served" in body["error"]
        refused(c.post("/v1/classify", json={"inputs": "x"}), 503, "not loaded")


def test_cors_is_off_unless_asked(tmp_path: Path) -> None:
    spec, origin = ModelSpec("slow", str(tmp_path)), {"Origin": "http://elsewhere.example"}
    with client_for(config(spec), [SlowModel("slow", tmp_path)]) as c:
        assert (
            "access-control-allow-origin"
            not in c.post("/v1/classify", json={"inputs": "x"}, headers=origin).headers
        )
    with client_for(
        ServeConfig([spec], cors_origins=["http://elsewhere.example"]), [SlowModel("slow", tmp_path)]
    ) as c:
        answer = c.post("/v1/classify", json={"inputs": "x"}, headers=origin)
        assert answer.headers["access-control-allow-origin"] == "http://elsewhere.example"


def test_no_path_a_client_sends_reaches_a_file(translator) -> None:
    for path in (
        "/static/../app.py",
        "/static/%2e%2e/app.py",
        "/static/..%2fconfig.py",
        "/static//etc/passwd",
    ):
        answer = translator.get(path)
        assert answer.status_code == 404 and "Limits" not in answer.text and "root:" not in answer.text


def test_the_config_names_what_is_wrong(tmp_path: Path) -> None:
    good = {"models": [{"name": "a", "path": str(tmp_path)}]}
    assert ServeConfig.from_dict(good).models[0].name == "a"
    for data, message in [
        ({**good, "prot": 1}, "unknown key 'prot'"),
        ({"models": [{"name": "a", "path": str(tmp_path / "missing")}]}, "is not a directory"),
        ({"models": [{"name": "a", "path": str(tmp_path)}] * 2}, "two models are named 'a'"),
        ({**good, "limits": {"max_queue": 0}}, "limits.max_queue must be a positive number"),
        ({**good, "limits": {"max_queue": 1.5}}, "limits.max_queue must be an integer"),
        ({"models": [{"name": "a b", "path": str(tmp_path)}]}, "model name 'a b'"),
        ({"models": [{"name": "a", "path": str(tmp_path), "precision": "fp8"}]}, "precision must be one of"),
        ({"models": []}, "no model to serve"),
    ]:
        with pytest.raises(ValueError, match=message):
            ServeConfig.from_dict(data)
    with pytest.raises(ValueError, match="limits.timeout_s must be a positive number"):
        Limits(timeout_s=0)


def test_the_yaml_config_reads_paths_from_its_folder(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "serve.yaml").write_text(
        "models:\n  - {name: m, path: models}\nport: 9000\nlimits: {max_queue: 7}\n"
    )
    loaded = ServeConfig.from_file(tmp_path / "serve.yaml")
    assert (
        Path(loaded.models[0].path) == tmp_path / "models"
        and loaded.port == 9000
        and loaded.limits.max_queue == 7
    )
    (tmp_path / "bad.yaml").write_text("models: [")
    with pytest.raises(ValueError, match="cannot read the serve config"):
        ServeConfig.from_file(tmp_path / "bad.yaml")


def test_a_bad_input_inside_a_batch_fails_its_own_request_only(tmp_path: Path) -> None:
    """A batch that fails is run again request by request."""
    model = SlowModel("slow", tmp_path)
    original = model.run

    def run(items, options):
        if "boom" in items:
            raise ValueError("boom is not a text this model reads")
        return original(items, options)

    model.run = run  # type: ignore[method-assign]
    app = create_app(config(ModelSpec("slow", str(tmp_path)), max_wait_ms=200), [model])
    with client_for_app(app):
        answers = asyncio.run(_together(app, ["fine", "boom", "also fine"]))
    assert [a.status_code for a in answers] == [200, 422, 200]
    assert "boom is not a text" in answers[1].json()["error"]


def test_a_lone_request_at_a_quiet_time_starts_at_once_and_a_burst_still_batches(tmp_path: Path) -> None:
    """The batcher waits max_wait_ms for others only when others are due: a lone request with no
    recent arrivals is run at once (not 1.5 s later); a burst's first request (the rest 50 ms apart)
    waits for the rest."""
    model = SlowModel("slow", tmp_path)
    app = create_app(config(ModelSpec("slow", str(tmp_path)), max_wait_ms=1500, max_batch_size=5), [model])
    with client_for_app(app) as c:
        start = time.monotonic()
        assert c.post("/v1/classify", json={"inputs": "alone"}).status_code == 200
        alone = time.monotonic() - start
        answers = asyncio.run(_together(app, ["one", "two", "three", "four", "five"], spread=0.05))
    assert alone < 1.0, f"a lone request waited {alone:.2f} s"
    assert [a.status_code for a in answers] == [200] * 5
    assert model.batches[0] == ["alone"] and sorted(map(len, model.batches[1:])) == [5], model.batches


async def _together(app, texts: list[str], spread: float = 0.0) -> list[httpx.Response]:
    """POST each text to /v1/classify at once, or ``spread`` seconds apart."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

        async def post(i: int, text: str) -> httpx.Response:
            await asyncio.sleep(i * spread)
            return await http.post("/v1/classify", json={"inputs": text})

        return await asyncio.gather(*(post(i, t) for i, t in enumerate(texts)))


def test_a_classifier_checkpoint_served_as_int8_is_refused() -> None:
    from scratchformer.serve.served import load_served

    with pytest.raises(ValueError, match="int8 is for translation models"):
        load_served(ModelSpec("imdb", str(CLASSIFIER), precision="int8"))
    assert SOURCES  # (the fixture sentences the other files translate)


def test_the_kind_of_every_checkpoint_we_read_is_found_and_served(tmp_path: Path) -> None:
    """Ours (the kind in config.json), a sentence-transformers folder, a Hugging Face
    BertForSequenceClassification, a plain BERT (an encoder), each by the one checkpoint_kind, and
    each served by its class (a masked-LM run's encoder as an embedding model)."""
    import transformers

    from scratchformer.formats.hf_bert import default_model_dir
    from scratchformer.serve.served import SERVED, served_class
    from scratchformer.tasks.shared import KINDS, checkpoint_kind

    assert [checkpoint_kind(str(p)) for p in (TRANSLATION, CLASSIFIER)] == ["translation", "text_classifier"]
    minilm = default_model_dir()  # all-MiniLM-L6-v2 (the test extra's package): modules.json
    assert minilm is None or checkpoint_kind(str(minilm)) == "embedding"
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "clf")
    transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    assert checkpoint_kind(str(tmp_path / "clf")) == "text_classifier"
    assert checkpoint_kind(str(tmp_path / "bert")) == "embedding"
    assert {kind: served_class(kind) for kind in KINDS} == {
        **SERVED,
        "masked_lm": SERVED["embedding"],
    }
    assert served_class("a_kind_nobody_serves") is None
