"""JSON Schema handling: the request-time check, the answer validator, the mock's example.

One module owns every use of ``jsonschema`` so that one policy holds everywhere:

* **No schema causes I/O.** Validators are built over :data:`REGISTRY`, a
  ``referencing.Registry`` that retrieves nothing; only the 2020-12 meta-schemas
  (shipped with ``jsonschema-specifications``) and the schema's own ``#…`` references
  resolve. :func:`check_schema` refuses any other ``$ref`` up front.
* **No pattern runs in exponential time.** ``pattern`` and ``patternProperties`` are
  matched with RE2 (``google-re2``, linear time); a pattern RE2 cannot compile (look-
  arounds, back-references) is refused by :func:`check_schema`.
* **No schema makes the mock generate an unbounded answer.** :func:`example_instance`
  builds the mock's answer within ``MOCK_MAX_OUTPUT_BYTES`` and ``MOCK_MAX_DEPTH``;
  :func:`check_schema` refuses a schema past either bound.

:func:`check_schema` raises :class:`SchemaRefused` (a ``ValueError``) with a message
fit for a 400 naming the field; the API serializers call it for ``response_schema``
and ``response_format.json_schema.schema``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from .conf import routing_settings

__all__ = [
    "REGISTRY",
    "AnswerValidator",
    "SchemaRefused",
    "SchemaTooLarge",
    "answer_validator",
    "check_schema",
    "example_instance",
]


class SchemaRefused(ValueError):
    """A schema the app will not use; the message says why (safe to show the caller)."""


class SchemaTooLarge(SchemaRefused):
    """The mock's answer for this schema would exceed MOCK_MAX_OUTPUT_BYTES / _DEPTH."""


def _retrieve_nothing(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


#: Retrieves nothing: a reference outside the schema never leads to a fetch.
REGISTRY: Registry[Any] = Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


# --- patterns: RE2, linear time ------------------------------------------------------


#: RE2's memory budget per compiled pattern (program + DFA cache); a pattern whose
#: program does not fit is refused. With the cache size below, at most 128 MiB.
_RE2_MAX_MEM = 2 * 1024 * 1024


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _RE2_MAX_MEM
    return re2.compile(pattern, options)


def _search(pattern: str, text: str) -> bool:
    return _compile(pattern).search(text) is not None


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for key, value in instance.items():
            if _search(patrn, key):
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        yield ValidationError(
            "Additional properties are not allowed ("
            + ", ".join(repr(e) for e in sorted(extras))
            + " unexpected)"
        )


#: Draft 2020-12 with RE2 for every keyword that runs a schema-supplied pattern
#: (``unevaluatedProperties`` next to ``patternProperties`` is refused by check_schema,
#: since jsonschema evaluates that pair with Python's backtracking ``re``).
AnswerValidator = validators.extend(
    Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def answer_validator(schema: Mapping[str, Any]) -> Validator:
    """The validator for structured answers: no retrieval, RE2 patterns."""
    return AnswerValidator(dict(schema), registry=REGISTRY)


# --- the request-time check ----------------------------------------------------------


def check_schema(value: Any) -> None:
    """Raise :class:`SchemaRefused` unless *value* is a schema the app may use.

    A valid Draft 2020-12 schema of at most ``MAX_SCHEMA_BYTES``; every ``$ref`` /
    ``$dynamicRef`` local (``#…``) and resolvable inside the schema; every pattern
    compiles with RE2; and the mock's answer fits ``MOCK_MAX_OUTPUT_BYTES`` /
    ``MOCK_MAX_DEPTH``. Pure computation: no I/O.
    """
    if not isinstance(value, Mapping):
        raise SchemaRefused("Expected a JSON Schema object.")
    limit = int(routing_settings.MAX_SCHEMA_BYTES)
    if len(json.dumps(value)) > limit:
        raise SchemaRefused(f"The schema is too large (more than {limit} bytes).")
    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as exc:
        raise SchemaRefused(f"Not a valid JSON Schema: {exc.message}") from None
    root = DRAFT202012.create_resource(dict(value))
    resolver = REGISTRY.resolver_with_root(root)
    found = _Walk()
    found.walk(value, resolver)
    if found.unevaluated and found.pattern_properties:
        raise SchemaRefused(
            "unevaluatedProperties cannot be combined with patternProperties in one schema."
        )
    example_instance(value)


#: Keywords whose value maps names to subschemas.
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


class _Walk:
    """One pass over the schema: references resolved in place, patterns compiled."""

    def __init__(self) -> None:
        self.unevaluated = False
        self.pattern_properties = False

    def walk(self, node: Any, resolver: Any) -> None:
        if isinstance(node, list):
            for item in node:
                self.walk(item, resolver)
            return
        if not isinstance(node, Mapping):
            return
        if isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(DRAFT202012.create_resource(dict(node)))
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if isinstance(ref, str):
                _check_ref(keyword, ref, resolver)
        if isinstance(node.get("pattern"), str):
            _check_pattern(node["pattern"])
        props = node.get("patternProperties")
        if isinstance(props, Mapping) and props:
            self.pattern_properties = True
            for patrn in props:
                _check_pattern(patrn)
        if "unevaluatedProperties" in node:
            self.unevaluated = True
        for key, child in node.items():
            if key in ("const", "enum", "default", "examples"):
                continue  # instance data, not subschemas
            if key in _SCHEMA_MAPS:
                if isinstance(child, Mapping):
                    for sub in child.values():
                        self.walk(sub, resolver)
                continue
            self.walk(child, resolver)


def _check_ref(keyword: str, ref: str, resolver: Any) -> None:
    if not ref.startswith("#"):
        raise SchemaRefused(
            f"{keyword} {ref[:200]!r} is not allowed: only local references "
            "('#/$defs/…' or '#anchor') resolve; nothing is ever fetched."
        )
    try:
        resolver.lookup(ref)
    except Unresolvable:
        raise SchemaRefused(
            f"{keyword} {ref[:200]!r} does not resolve inside the schema."
        ) from None


def _check_pattern(pattern: str) -> None:
    try:
        _compile(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else ""
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise SchemaRefused(
            f"The pattern {pattern[:200]!r} is not supported ({str(reason)[:200]}): patterns "
            "run on RE2 (linear time), which has no look-around or back-references and "
            "bounds a pattern's size."
        ) from None


# --- the mock's example answer -------------------------------------------------------


def example_instance(
    schema: Any, *, max_bytes: int | None = None, max_depth: int | None = None
) -> Any:
    """A small deterministic value that satisfies common JSON Schema shapes.

    Its JSON encoding (``json.dumps`` defaults) never exceeds *max_bytes*
    (``MOCK_MAX_OUTPUT_BYTES``) and it never descends past *max_depth*
    (``MOCK_MAX_DEPTH``): past either bound it raises :class:`SchemaTooLarge` without
    having built anything large.
    """
    limit = int(routing_settings.MOCK_MAX_OUTPUT_BYTES if max_bytes is None else max_bytes)
    depth_limit = int(routing_settings.MOCK_MAX_DEPTH if max_depth is None else max_depth)
    value, _ = _Example(schema, limit, depth_limit).build(schema, 0)
    return value


class _Example:
    def __init__(self, root: Any, max_bytes: int, max_depth: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    def _pointer(self, ref: str) -> Any:
        """The subschema a local ``#/a/b`` reference points at (None if it does not)."""
        node = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping):
                node = node.get(part)
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def _fits(self, size: int) -> int:
        if size > self.max_bytes:
            raise SchemaTooLarge(
                f"The mock's answer for this schema would exceed {self.max_bytes} bytes "
                "(MOCK_MAX_OUTPUT_BYTES): lower minItems / minLength."
            )
        return size

    def _data(self, value: Any) -> tuple[Any, int]:
        return value, self._fits(len(json.dumps(value)))

    def build(self, schema: Any, depth: int, variant: int = 0) -> tuple[Any, int]:
        """The example for ``schema`` and its JSON size. ``variant`` > 0 asks for a value
        different from the other variants where the schema leaves room (``uniqueItems``:
        item *i* is variant *i*)."""
        if not isinstance(schema, Mapping):
            return None, 4
        if depth > self.max_depth:
            raise SchemaTooLarge(
                f"The schema nests deeper than {self.max_depth} levels (MOCK_MAX_DEPTH)."
            )
        ref = schema.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            return self.build(self._pointer(ref), depth + 1, variant)
        if "const" in schema:
            return self._data(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return self._data(enum[variant % len(enum)])
        for combinator in ("anyOf", "oneOf", "allOf"):
            options = schema.get(combinator)
            if isinstance(options, list) and options:
                return self.build(options[0], depth + 1, variant)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, depth, variant)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            suffix = str(variant) if variant else ""
            length = max(4 + len(suffix), _count(schema.get("minLength")))
            self._fits(length + 2)
            return self._data("mock" + suffix + "x" * (length - 4 - len(suffix)))
        if kind == "integer":
            return self._data(_number(schema.get("minimum"), int) + variant)
        if kind == "number":
            return self._data(_number(schema.get("minimum"), float) + variant)
        if kind == "boolean":
            return bool(variant % 2), 5 if variant % 2 == 0 else 4
        return None, 4

    def _object(self, schema: Mapping[str, Any], depth: int, variant: int) -> tuple[Any, int]:
        """The required properties, then (``minProperties``) the optional ones, then
        ``extraN`` properties where ``additionalProperties`` allows them."""
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        names = [n for n in (required if isinstance(required, list) else list(props))]
        wanted = _count(schema.get("minProperties"))
        names += [n for n in props if n not in names][: max(0, wanted - len(names))]
        additional = schema.get("additionalProperties", {})
        extra = 0
        while len(set(names)) < wanted and additional is not False and extra < wanted:
            extra += 1
            names.append(f"extra{extra}")
        out: dict[str, Any] = {}
        size = 2
        for name in names:
            if not isinstance(name, str) or name in out:
                continue
            sub = props.get(name, additional if name.startswith("extra") else {})
            item, item_size = self.build(
                sub if isinstance(sub, Mapping) else {}, depth + 1, variant
            )
            size = self._fits(size + len(json.dumps(name)) + 2 + item_size + 2 * bool(out))
            out[name] = item
        return out, size

    def _array(self, schema: Mapping[str, Any], depth: int) -> tuple[Any, int]:
        """``minItems`` items; ``minContains`` (1 by default) of them from ``contains``;
        distinct variants when ``uniqueItems``. Sized before anything large is built."""
        contains = schema.get("contains")
        holding = (
            max(1, _count(schema.get("minContains", 1))) if isinstance(contains, Mapping) else 0
        )
        count = max(_count(schema.get("minItems")), holding)
        self._fits(1 + 2 * count)  # every item takes at least a digit and a comma
        items = schema.get("items")
        items = items if isinstance(items, Mapping) else {}
        if schema.get("uniqueItems") is True and count > 1:
            out: list[Any] = []
            size = 2
            for i in range(count):
                sub = contains if i < holding else items
                item, item_size = self.build(sub, depth + 1, i)
                size = self._fits(size + item_size + 2 * bool(out))
                out.append(item)
            return out, size
        # Identical items: sized first, then built by reference (never a large copy).
        first, first_size = self.build(contains, depth + 1) if holding else (None, 0)
        rest, rest_size = self.build(items, depth + 1) if count > holding else (None, 0)
        size = self._fits(
            2 + holding * first_size + (count - holding) * rest_size + 2 * max(0, count - 1)
        )
        return [first] * holding + [rest] * (count - holding), size


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value)) if value < 1e18 else 10**18


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return kind(0)
    try:
        return kind(value)
    except (OverflowError, ValueError):
        return kind(0)
