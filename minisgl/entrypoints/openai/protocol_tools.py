"""Pydantic models of OpenAI's tool calls: the tools a request offers, the calls a response makes.

Mirrors the tool classes of python/sglang/srt/entrypoints/openai/protocol.py (Function,
Tool, ToolChoiceFuncName, ToolChoice, FunctionResponse, ToolCall). The request side is
strict like every minisgl request model; a tool's ``parameters`` must be a JSON schema
(checked with jsonschema, as SGLang's _validate_request does).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, field_validator


class Function(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    # OpenAI's promise that the arguments follow the schema: a required or named choice always
    # does (the grammar enforces it); under auto minisgl does not constrain (SGLang's structural tags).
    strict: Optional[bool] = False

    @field_validator("parameters")
    @classmethod
    def _is_a_schema(cls, parameters):
        if parameters is not None:
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(parameters)
            except jsonschema.SchemaError as e:
                raise ValueError(f"the parameters are not a JSON schema: {e.message}") from None
        return parameters


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"] = "function"
    function: Function


class ToolChoiceFuncName(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str


class ToolChoice(BaseModel):
    """A named choice: ``{"type": "function", "function": {"name": ...}}``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"] = "function"
    function: ToolChoiceFuncName


ToolChoiceField = Optional[Union[Literal["auto", "required", "none"], ToolChoice]]


class FunctionResponse(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class ToolCall(BaseModel):
    """One call in a response, or one call's delta in a stream (``index`` says which call)."""

    id: Optional[str] = None
    index: Optional[int] = None
    type: Literal["function"] = "function"
    function: FunctionResponse
