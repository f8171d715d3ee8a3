"""The request bodies are typed, and the OpenAPI document shows them: every decoding parameter with
its type and range, as GenerationParameters declares them (the one place the bounds are written),
as the Serve guide's table gives them and as the server enforces them; every error status a route
answers, from the one table of errors."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from servers import SlowModel, client_for, config, png, refused

from scratchformer.generation import GenerationConfig
from scratchformer.serve import ModelSpec, create_app
from scratchformer.serve.errors import ERRORS, MODEL_ROUTE_ERRORS
from scratchformer.serve.parameters import RANGES, GenerationParameters, range_of

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "serve.md"
TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("slow")
    return create_app(config(ModelSpec("slow", str(folder))), [SlowModel("slow", folder)]).openapi()


def parameters_schema(document: dict, body: str) -> dict:
    schemas = document["components"]["schemas"]
    ref = schemas[body]["properties"]["parameters"]["$ref"]
    return schemas[ref.rsplit("/", 1)[1]]


def documented(prop: dict) -> tuple[str, float | None, float | None, bool]:
    """A property's (type, lower bound, upper bound, whether the lower bound is excluded)."""
    options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
    (schema,) = options
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    return schema["type"], low, schema.get("maximum"), "exclusiveMinimum" in schema


def test_the_parameters_are_generation_configs_fields_a_seed_and_a_prefix() -> None:
    fields = {f.name for f in dataclasses.fields(GenerationConfig)} - {
        "decoder_start_token_id",
        "eos_token_id",
    }
    assert set(GenerationParameters.model_fields) == fields | {"seed", "prefix"}


def test_openapi_gives_every_parameter_its_type_and_range(document) -> None:
    """The document's schema of ``parameters`` (the same for every route that takes them) is the
    pydantic model's: each field, its type, its bounds; unknown names are refused."""
    schema = parameters_schema(document, "TextRequest")
    assert schema == parameters_schema(document, "AttentionRequest")
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(GenerationParameters.model_fields)
    for name, field in GenerationParameters.model_fields.items():
        kind, low, high, above = documented(schema["properties"][name])
        base = next(
            t
            for t in (int, float, bool, str)
            if t in (field.annotation, *getattr(field.annotation, "__args__", ()))
        )
        assert kind == TYPES[base], name
        allowed = range_of(name)
        if allowed is None:
            assert low is None and high is None, name
            continue
        assert (low, above) == (allowed.low, allowed.above), name
        assert high == (None if allowed.high == float("inf") else allowed.high), name
    assert {n for n, p in schema["properties"].items() if documented(p)[2] is not None} == set(RANGES)


def guide_rows() -> dict[str, str]:
    """The guide's table of parameters (under its "| parameter | range |" head): each name's range."""
    text = GUIDE.read_text(encoding="utf-8")
    table = text[text.index("| parameter | range |") :].split("\n\n")[0]
    return dict(re.findall(r"^\| `([a-z_]+)`[^|]*\| ([^|]+) \|", table, re.MULTILINE))


def shown(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def test_the_guide_gives_each_parameter_the_documents_type_and_range(document) -> None:
    rows, words = (
        guide_rows(),
        {"integer": "integer", "number": "number", "boolean": "`true`", "string": "text"},
    )
    for name, prop in parameters_schema(document, "TextRequest")["properties"].items():
        assert name in rows, f"the guide's table of parameters has no row for {name}"
        kind, low, high, above = documented(prop)
        assert rows[name].startswith(words[kind]), (name, kind, rows[name])
        if low is not None:
            assert f"{'above ' if above else ''}{shown(low)} to" in rows[name], (name, low, rows[name])
        if high is not None:
            assert f"to {shown(high)}" in rows[name], (name, high, rows[name])
        elif low is not None:  # max_new_tokens, min_new_tokens: the server's limit
            assert "the limit `max_new_tokens`" in rows[name], (name, rows[name])


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A server whose one model (a classifier) takes no parameters: a request's parameters in range
    pass validation and reach it ("takes none"); out of range they are refused before it."""
    folder = tmp_path_factory.mktemp("slow")
    with client_for(config(ModelSpec("slow", str(folder))), [SlowModel("slow", folder)]) as c:
        yield c


def past(low: float, high: float, integer: bool) -> list[object]:
    step = 1 if integer else max(abs(high), 1) * 1e-6
    return [low - step, high + step, True, None, "1", *([1.5] if integer else [])]


@pytest.mark.parametrize("name", sorted(RANGES))
def test_each_parameter_is_enforced_at_its_documented_bounds(classifier, document, name: str) -> None:
    _, low, high, above = documented(parameters_schema(document, "TextRequest")["properties"][name])
    integer = RANGES[name].integer
    for value in [high] if above else [low, high]:
        body = {"inputs": "x", "parameters": {name: value}}
        refused(classifier.post("/v1/classify", json=body), 422, "takes none")  # (valid: the model says no)
    for value in ([low] if above else []) + past(low, high, integer):
        body = {"inputs": "x", "parameters": {name: value}}
        refused(classifier.post("/v1/classify", json=body), 422, f"parameters.{name} must be {RANGES[name]}")


def test_a_form_field_of_parameters_is_checked_as_a_json_body_is(classifier) -> None:
    image = [("images", ("a.png", png(), "image/png"))]
    for parameters, words in [
        ('{"top_p": 0}', ["parameters.top_p must be a number > 0 and <= 1, got 0"]),
        ('{"beams": 2}', ["parameters: unknown key 'beams'; did you mean num_beams or beam_size?"]),
        ("[1]", ["parameters: expected a JSON object"]),
        ("{", ["parameters: not JSON"]),
    ]:
        refused(classifier.post("/v1/caption", files=image, data={"parameters": parameters}), 422, *words)


def test_every_route_documents_the_errors_it_answers_from_the_one_table(document) -> None:
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            errors = {int(code): r for code, r in operation["responses"].items() if int(code) >= 400}
            if method == "post":
                assert set(errors) == set(MODEL_ROUTE_ERRORS) | {422}, path
            for code, response in errors.items():
                assert response["description"] == ERRORS[code].when, (path, code)
                assert response["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert set(document["paths"]["/v1/models"]["get"]["responses"]) == {"200", "401"}


def test_an_error_body_says_its_statuss_type_from_the_table(classifier) -> None:
    answers = {
        404: classifier.get("/v1/nope"),
        405: classifier.get("/v1/classify"),
        415: classifier.post("/v1/classify", content=b"x", headers={"content-type": "text/plain"}),
        422: classifier.post("/v1/classify", json={"inputs": []}),
    }
    for status, answer in answers.items():
        assert json.loads(answer.text)["error_type"] == ERRORS[status].error_type
        refused(answer, status)
