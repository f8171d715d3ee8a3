"""The bodies the API reads, typed, so that FastAPI validates them (a 422 naming the field) and the
OpenAPI document shows every field, each decoding parameter with its type and range
(:class:`~scratchformer.serve.parameters.GenerationParameters`). Requests have TGI/TEI's shape,
``{"inputs": "text" | ["text", ...], "parameters": {...}, "model", "stream"}``; /v1/embeddings
OpenAI's. An upload route's ``parameters`` is a form field holding a JSON object
(:func:`form_parameters`)."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scratchformer.serve.errors import RequestError, one_line
from scratchformer.serve.parameters import GenerationParameters

__all__ = ["AttentionRequest", "EmbeddingsRequest", "TextRequest", "form_parameters"]


class TextRequest(BaseModel):
    """POST /v1/translate, /v1/classify, /v1/embed (a classifier or an encoder takes no parameters)."""

    model_config = ConfigDict(extra="forbid")
    inputs: str | list[str] = Field(description="one text, or a list of texts")
    parameters: GenerationParameters = Field(
        default_factory=GenerationParameters, description="decoding options (GenerationConfig's)"
    )
    model: str | None = Field(default=None, description="a loaded model's name (needed if several fit)")
    stream: bool = Field(
        default=False, description="server-sent events: the tokens (greedy, sampling), each input's answer"
    )


class AttentionRequest(BaseModel):
    """POST /v1/attention: one text's translation and attention weights."""

    model_config = ConfigDict(extra="forbid")
    inputs: str
    parameters: GenerationParameters = Field(default_factory=GenerationParameters)
    model: str | None = None
    layer: int | None = Field(default=None, description="one layer's weights (None: every layer)")


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (its other fields, as ``user``, are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")
    input: str | list[str]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = Field(default=None, description="must be the model's width: no truncation")


def form_parameters(text: str) -> GenerationParameters:
    """A form's ``parameters`` field: a JSON object of decoding options, checked as a JSON body's
    are (the same 422s)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise RequestError(422, f"parameters: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise RequestError(422, "parameters: expected a JSON object")
    try:
        return GenerationParameters.model_validate(value)
    except ValidationError as e:
        raise RequestError(422, one_line(e.errors(), ("parameters",))) from None
