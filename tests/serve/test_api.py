"""The HTTP API on the fixture models: every endpoint answers what the tasks' Python API (and the
command line's JSON Lines) answer, batched requests equal one-at-a-time ones, server-sent events
parse, and the OpenAPI document is the committed one."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from servers import (
    CAPTIONING,
    CLASSIFIER,
    SOURCES,
    TRANSLATION,
    bert_encoder,
    client_for,
    concurrently,
    config,
    png,
)

from scratchformer.cli import main
from scratchformer.serve import ModelSpec, create_app
from scratchformer.serve.served import load_served

SNAPSHOT = Path(__file__).parent / "openapi_shape.json"


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> Path:
    return bert_encoder(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def client(encoder_dir: Path):
    specs = [
        ModelSpec("de-en", str(TRANSLATION)),
        ModelSpec("imdb", str(CLASSIFIER)),
        ModelSpec("shapes", str(CAPTIONING)),
        ModelSpec("minilm", str(encoder_dir), kind="embedding"),
    ]
    with client_for(config(*specs, max_wait_ms=20)) as c:
        yield c


def test_status_routes_and_the_model_list(client) -> None:
    assert client.get("/health").json() == {"status": "alive"}
    assert client.get("/ready").json() == {"status": "ready", "models": ["de-en", "imdb", "minilm", "shapes"]}
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {k: m["kind"] for k, m in models.items()} == {
        "de-en": "translation", "imdb": "text_classifier", "shapes": "captioning", "minilm": "embedding",
    }  # fmt: skip
    assert models["minilm"]["endpoints"] == ["/v1/embed", "/v1/embeddings"]
    assert client.get("/docs").status_code == 200 and "<html" in client.get("/").text.lower()


@pytest.mark.machine  # the same answers whatever the machine's precision choice
def test_translations_hold_the_command_lines_json_fields(client, capsys) -> None:
    answers = client.post(
        "/v1/translate", json={"inputs": SOURCES[:2], "parameters": {"num_beams": 3}}
    ).json()
    assert main(["translate", "--checkpoint", str(TRANSLATION), "--json", "--beam", "3", SOURCES[1]]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert answers[1]["translation_text"] == cli["translation_text"] and answers[1]["tokens"] == cli["tokens"]
    assert set(answers[1]) == set(cli) and abs(answers[1]["score"] - cli["score"]) < 1e-4
    one = client.post("/v1/translate", json={"inputs": SOURCES[0], "parameters": {"num_beams": 3}}).json()
    assert one[0]["translation_text"] == answers[0]["translation_text"]  # one string: a list of one answer


def test_batched_requests_equal_one_at_a_time(client) -> None:
    """Requests sent together are decoded together (the metrics say so: more than one input per
    step on average) with the answers each gets alone: same texts and tokens, scores within float
    noise of a different batch."""
    alone = [client.post("/v1/translate", json={"inputs": s}).json()[0] for s in SOURCES]
    before = _batches(client)
    app = client.app
    together = asyncio.run(concurrently(app, [("/v1/translate", {"inputs": s}) for s in SOURCES]))
    after = _batches(client)
    steps, inputs = after[1] - before[1], after[0] - before[0]
    assert inputs > steps, "no input was decoded together with another"
    for a, b in zip(alone, (r.json()[0] for r in together)):
        assert (a["translation_text"], a["tokens"]) == (b["translation_text"], b["tokens"])
        assert abs(a["score"] - b["score"]) < 1e-4


def _batches(client) -> tuple[float, float]:
    text = client.get("/metrics").text
    values = [
        float(line.split()[-1])
        for key in ("sum", "count")
        for line in text.splitlines()
        if line.startswith(f'scratchformer_batch_size_{key}{{model="de-en"}}')
    ]
    return values[0], values[1]


def test_sampling_with_a_seed_is_reproducible_in_any_batch(client) -> None:
    body = {"inputs": SOURCES[:3], "parameters": {"do_sample": True, "seed": 7, "top_k": 20}}
    first, again = (client.post("/v1/translate", json=body).json() for _ in range(2))
    assert [a["tokens"] for a in first] == [a["tokens"] for a in again]
    alone = client.post("/v1/translate", json={**body, "inputs": SOURCES[1]}).json()[0]
    assert alone["tokens"] == first[1]["tokens"]


def test_classify_answers_every_class_probability(client) -> None:
    from scratchformer.tasks.classification import load_classifier

    texts = ["a great film", "dull and long"]
    answers = client.post("/v1/classify", json={"inputs": texts}).json()
    reference = load_classifier(CLASSIFIER, device="cpu")
    probs = reference.probabilities(texts)
    for answer, p in zip(answers, probs):
        assert answer["label"] == reference.label_names[int(p.argmax())]
        assert max(abs(answer["scores"][n] - float(q)) for n, q in zip(reference.label_names, p)) < 1e-5
        assert answer["score"] == max(answer["scores"].values())


def test_embeddings_in_our_shape_and_openais(client, encoder_dir: Path) -> None:
    from scratchformer.tasks.sentence_embedding import SentenceEncoder

    texts = ["a man plays guitar", "a dog"]
    expected = SentenceEncoder.from_pretrained(encoder_dir).encode(texts)
    ours = client.post("/v1/embed", json={"inputs": texts}).json()
    assert float((torch.tensor([a["embedding"] for a in ours]) - expected).abs().max()) < 1e-5
    openai = client.post("/v1/embeddings", json={"input": texts, "model": "minilm"}).json()
    assert openai["object"] == "list" and openai["model"] == "minilm" and openai["usage"]["prompt_tokens"] > 0
    assert [d["index"] for d in openai["data"]] == [0, 1] and openai["data"][1]["embedding"] == ours[1][
        "embedding"
    ]
    packed = client.post("/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    unpacked = torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert float((unpacked - expected[0]).abs().max()) < 1e-5  # float32, little-endian: OpenAI's encoding
    wrong = client.post("/v1/embeddings", json={"input": "a", "dimensions": 8})
    assert wrong.status_code == 422 and "embeddings have 32" in wrong.json()["error"]


def test_a_caption_of_an_uploaded_image(client) -> None:
    from scratchformer.tasks.captioning.ensemble import load_ensemble

    image = png()
    answer = client.post(
        "/v1/caption",
        files=[("images", ("a.png", image, "image/png"))],
        data={"parameters": '{"num_beams": 2}'},
    ).json()[0]
    captioner = load_ensemble([CAPTIONING], device="cpu")
    served = load_served(ModelSpec("x", str(CAPTIONING)))
    pixels, _ = served.images([image])
    expected = captioner.generate(pixels, captioner.generation_config(2))[0][0]
    assert answer["image"] == "a.png" and answer["generated_text"] == expected.text
    found = client.post("/v1/caption/attention", files=[("image", ("a.png", image, "image/png"))]).json()
    grid = found["grid"]
    assert found["image"].startswith("data:image/png;base64,") and len(found["attention"]) == len(
        found["words"]
    )
    assert all(len(row) == grid * grid and abs(sum(row) - 1) < 1e-3 for row in found["attention"])


def test_translation_attention_per_layer(client) -> None:
    from scratchformer.tasks.translation import load_translator, translation_attention

    body = {"inputs": SOURCES[1], "parameters": {"num_beams": 2}}
    every = client.post("/v1/attention", json=body).json()
    one = client.post("/v1/attention", json={**body, "layer": 0}).json()
    translator = load_translator(TRANSLATION, device="cpu")
    expected = translation_attention(translator, SOURCES[1], translator.generation_config(2))
    assert every["translation"] == expected["translation"] and every["source"] == expected["source"]
    cross = torch.tensor(one["weights"]["decoder.cross_attn"]["0"])
    assert cross.shape == expected["weights"]["decoder.layers.0.cross_attn"].shape
    assert (
        float((cross - expected["weights"]["decoder.layers.0.cross_attn"]).abs().max()) <= 5e-5
    )  # 4 decimals
    assert set(one["weights"]["encoder.self_attn"]) == {"0"}
    assert set(every["weights"]["decoder.self_attn"]) == {str(i) for i in range(every["layers"])}
    assert client.post("/v1/attention", json={**body, "layer": 99}).status_code == 422


def _events(text: str) -> list[tuple[str, dict]]:
    """Server-sent events: (event name, data) pairs."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events


def test_server_sent_events_one_per_input_then_done(client) -> None:
    """Beam search: one event per input as it is done, then "done"; the answers of the plain request."""
    body = {"inputs": SOURCES[:3], "parameters": {"num_beams": 2}}
    plain = client.post("/v1/translate", json=body).json()
    with client.stream("POST", "/v1/translate", json={**body, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response.read().decode())
    assert [e for e, _ in events] == ["message"] * 3 + ["done"]
    by_index = {data["index"]: data for _, data in events[:3]}
    assert [by_index[i]["translation_text"] for i in range(3)] == [p["translation_text"] for p in plain]


@pytest.mark.parametrize(
    "parameters", [{"num_beams": 1}, {"do_sample": True, "seed": 3, "num_return_sequences": 2}]
)
def test_greedy_and_sampled_streams_send_each_token_as_it_is_chosen(client, parameters) -> None:
    """Each output's token events, in order, are its final tokens, and their texts add up to its text."""
    body = {"inputs": SOURCES[:3], "parameters": parameters, "stream": True}
    events = _events(client.post("/v1/translate", json=body).text)
    assert events[-1][0] == "done" and sum(e == "message" for e, _ in events) == 3
    for _, answer in (e for e in events if e[0] == "message"):
        for j, output in enumerate(answer["nbest"]):
            mine = [
                d["token"]
                for e, d in events
                if e == "token" and d["index"] == answer["index"] and d["sequence"] == j
            ]
            assert [t["id"] for t in mine if not t["special"]] == output["tokens"]
            assert [t["special"] for t in mine] == [False] * len(output["tokens"]) + [True]  # then EOS
            assert "".join(t["text"] for t in mine) == output["text"]
    caption = client.post(
        "/v1/caption",
        files=[("images", ("a.png", png(), "image/png"))],
        data={"stream": "true", "parameters": "{}"},
    )
    names = [e for e, _ in _events(caption.text)]
    assert names[-2:] == ["message", "done"] and names.count("message") == 1  # (the recipe's beam: no tokens)
    greedy = client.post(
        "/v1/caption",
        files=[("images", ("a.png", png(), "image/png"))],
        data={"stream": "true", "parameters": '{"num_beams": 1}'},
    )
    tokens = [d["token"]["text"] for e, d in _events(greedy.text) if e == "token"]
    assert "".join(tokens) == _events(greedy.text)[-2][1]["generated_text"]


def api_shape(document: dict) -> dict:
    """What a client relies on in the OpenAPI document: each route's methods, request fields (with
    whether they are required) and response codes; not the generator's wording, which FastAPI and
    pydantic releases change."""
    schemas = document["components"]["schemas"]

    def fields(ref: str) -> dict[str, bool]:
        schema = schemas[ref.rsplit("/", 1)[1]]
        return {name: name in schema.get("required", ()) for name in schema.get("properties", {})}

    shape = {}
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            content = op.get("requestBody", {}).get("content", {})
            body = {
                kind: fields(c["schema"]["$ref"])
                for kind, c in content.items()
                if "$ref" in c.get("schema", {})
            }
            shape[f"{method.upper()} {path}"] = {"body": body, "responses": sorted(op["responses"])}
    return shape


def test_the_api_is_the_committed_snapshot(client) -> None:
    """A changed API shows in review: regenerate with UPDATE_SNAPSHOT=1."""
    shape = api_shape(client.get("/openapi.json").json())
    text = json.dumps(shape, indent=1, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), "the API changed: UPDATE_SNAPSHOT=1 pytest tests/serve/test_api.py"
    assert shape["POST /v1/translate"]["body"]["application/json"] == {
        "inputs": True, "parameters": False, "model": False, "stream": False,
    }  # fmt: skip
    assert {"images": True, "parameters": False, "model": False, "stream": False} == next(
        iter(shape["POST /v1/caption"]["body"].values())
    )


def test_models_given_as_objects_are_served_as_they_are(tmp_path: Path) -> None:
    from servers import SlowModel

    model = SlowModel("slow", tmp_path)
    with client_for(config(ModelSpec("slow", str(tmp_path))), [model]) as c:
        assert c.post("/v1/classify", json={"inputs": "a b c"}).json()[0]["label"] == "5"
    assert create_app(config(ModelSpec("slow", str(tmp_path))), [model]).title == "scratchformer"


def test_our_hugging_face_export_is_served_as_the_translator_it_came_from(tmp_path: Path) -> None:
    """A Hugging Face folder (here our --format hf export: Marian or Pegasus) is read as a translator."""
    from scratchformer.tasks.translation import load_translator

    translator = load_translator(TRANSLATION, device="cpu")
    export = translator.save_pretrained(tmp_path / "hf")
    with client_for(config(ModelSpec("hf", str(export)))) as c:
        assert c.get("/v1/models").json()["data"][0]["kind"] == "translation"
        answers = c.post("/v1/translate", json={"inputs": SOURCES[:3]}).json()
    assert [a["translation_text"] for a in answers] == translator.translate(SOURCES[:3])


def test_metrics_count_requests_by_model_route_and_code(client) -> None:
    client.post("/v1/translate", json={"inputs": "x", "parameters": {"nope": 1}})
    client.post("/v1/classify", json={"inputs": "fine"})
    text = client.get("/metrics").text
    assert 'scratchformer_requests_total{code="422",endpoint="/v1/translate",model="de-en"}' in text
    assert 'scratchformer_requests_total{code="200",endpoint="/v1/classify",model="imdb"}' in text
    for name in (
        "request_seconds_count",
        "queue_seconds_count",
        "inference_seconds_count",
        "batch_size_count",
    ):
        assert f'scratchformer_{name}{{model="imdb"' in text or f"scratchformer_{name}{{endpoint" in text, (
            name
        )
    assert 'scratchformer_queue_depth{model="imdb"} 0.0' in text
    assert 'scratchformer_tokens_total{direction="input",model="imdb"}' in text
