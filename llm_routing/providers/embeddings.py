"""What every adapter's embeddings share: the vectors' wire forms (a JSON list of
numbers, or OpenAI's base64 of little-endian float32), the check that an answer's
vectors are what was asked (:func:`checked_answer`, run by the walk on every
candidate's answer, whatever its kind), the mock's deterministic unit vectors and the
token estimate of a vendor that reports none.

A vector is any sequence of floats: an ``array.array("f")`` when it came as base64
(kept as is: re-encoding it for a base64 answer is a copy of its bytes), an
``array.array("d")`` when it came as JSON numbers (converted in C, which also refuses
anything that is not a number), a list of floats from the mock.
"""

from __future__ import annotations

import array
import base64
import binascii
import hashlib
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..errors import ResponseError
from ..types import AuditRequest, EmbeddingInput, ProviderConfig, ProviderResult

__all__ = [
    "MOCK_DIMENSIONS",
    "Vector",
    "checked_answer",
    "estimated_tokens",
    "from_base64",
    "mock_vector",
    "to_base64",
    "to_floats",
    "vector_of",
]

#: The mock's vector length when nothing declares or asks for one.
MOCK_DIMENSIONS = 256

Vector = Sequence[float]


def from_base64(text: str) -> array.array[float]:
    """OpenAI's ``encoding_format: "base64"`` vector: little-endian float32 bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ResponseError("An embedding is not valid base64.") from None
    if len(raw) % 4:
        raise ResponseError("An embedding's base64 is not a whole number of float32s.")
    vector = array.array("f")
    vector.frombytes(raw)
    if sys.byteorder == "big":
        vector.byteswap()
    return vector


def to_base64(vector: Vector) -> str:
    """A vector as OpenAI's base64 (little-endian float32), as the client decodes it."""
    if isinstance(vector, array.array) and vector.typecode == "f":
        packed = vector
    else:
        packed = array.array("f", vector)
    if sys.byteorder == "big":
        packed = array.array("f", packed)
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def vector_of(value: Any, where: str) -> Vector:
    """One vector of a JSON answer: a list of numbers, or base64 text."""
    if isinstance(value, str):
        return from_base64(value)
    if isinstance(value, list):
        try:
            return array.array("d", value)
        except (TypeError, OverflowError):
            pass
    raise ResponseError(f"{where} is not a list of numbers.")


def checked_answer(
    result: ProviderResult, request: AuditRequest, config: ProviderConfig
) -> ProviderResult:
    """``result`` when its vectors are what ``request`` asked of this candidate — one
    per input, all of one length, that length the walk's expected dimension (else the
    asked one, else the row's declared one), every number finite — else the same
    attempt as a ``response`` error (a provider fault: never returned to a caller).
    Results of other calls and failed ones pass untouched."""
    if request.call != "embed" or not result.ok:
        return result
    expected = request.expected_dimensions or request.dimensions or config.embedding_dimensions
    problem = _problem(result.vectors, len(request.inputs), expected)
    if problem is None:
        return result
    return replace(
        result,
        mode="error",
        status="error",
        vectors=(),
        error=ResponseError(problem).to_info(),
    )


def _problem(vectors: tuple[Vector, ...], count: int, expected: int | None) -> str | None:
    if len(vectors) != count:
        return f"The provider answered {len(vectors)} embeddings for {count} inputs."
    lengths = {len(v) for v in vectors}
    if len(lengths) > 1:
        return "The provider answered embeddings of different lengths."
    length = lengths.pop() if lengths else expected
    if not length:
        return "The provider answered empty embeddings."
    if expected is not None and length != expected:
        return f"The provider answered {length}-dimensional embeddings; {expected} were expected."
    # A non-finite number anywhere makes the sum non-finite (one pass, in C).
    if not all(math.isfinite(sum(v)) for v in vectors):
        return "The provider answered an embedding with a non-finite number."
    return None


def mock_vector(config: ProviderConfig, item: EmbeddingInput, dimension: int) -> list[float]:
    """A deterministic unit vector of ``dimension`` for ``item``: the same model and
    input always give the same vector, on every platform (SHAKE-256 of both, read as
    little-endian 16-bit numbers, centred and normalized)."""
    material = item if isinstance(item, str) else ",".join(map(str, item))
    digest = hashlib.shake_256(f"{config.model}\x00{material}".encode("utf-8", "surrogatepass"))
    numbers = array.array("H", digest.digest(2 * dimension))
    if sys.byteorder == "big":
        numbers.byteswap()
    vector = [n - 32767.5 for n in numbers]
    norm = math.sqrt(math.fsum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def estimated_tokens(inputs: Sequence[EmbeddingInput]) -> int:
    """Tokens of ``inputs`` for a vendor that reports none: four characters a token
    for a text (at least one), the ids of a token array."""
    return sum(len(x) if not isinstance(x, str) else max(1, (len(x) + 3) // 4) for x in inputs)


def to_floats(vector: Vector) -> list[float]:
    """A vector as a list of floats (a JSON answer's ``embedding``)."""
    if isinstance(vector, array.array):
        return vector.tolist()
    return vector if isinstance(vector, list) else list(vector)
