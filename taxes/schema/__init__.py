"""The published JSON Schemas of what taxes writes (result-v1.json: result documents; hardware-v1.json: hardware
profiles), and the validator
that checks a parsed document against one with a message naming the field's path.

jsonschema checks each value; two additions:
- integers are strict: true, false and 2.0 are not integers (JSON Schema itself would take 2.0);
- long arrays of plain numbers or strings (samples, stored timelines) are checked in one pass over the
  list (type and bounds together), so a document of hundreds of megabytes validates in seconds; any
  array that fails that pass is checked item by item, which finds the first bad item and its path.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from taxes.errors import TaxesError
from taxes.sanitize import json_type as _json_type, printable

RESULT_V1 = "result-v1.json"
HARDWARE_V1 = "hardware-v1.json"


@lru_cache(maxsize=None)
def schema(name: str = RESULT_V1) -> dict:
    return json.loads(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


def _strict_int(checker, value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(checker, value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_FAST_TYPES = {"number": (int, float), "integer": (int,), "string": (str,)}


def _fast_ok(items: dict, instance: list) -> bool:
    """Whether every item of a long list meets a simple item schema ({type, minimum, maximum, maxLength},
    type one of number, integer, string, optionally with null): one pass, no per-item validator."""
    types = items.get("type")
    names = types if isinstance(types, list) else [types]
    nullable = "null" in names
    kinds = [n for n in names if n != "null"]
    if len(kinds) != 1 or kinds[0] not in _FAST_TYPES or set(items) - {"type", "minimum", "maximum", "maxLength"}:
        return False
    allowed = _FAST_TYPES[kinds[0]]
    types = set(map(type, instance))  # type(): bool is not int here
    if nullable and type(None) in types:
        types.discard(type(None))
        values = [x for x in instance if x is not None]
    else:
        values = instance
    if not types <= set(allowed):
        return False
    if kinds[0] == "string":
        return "maxLength" not in items or not values or max(map(len, values)) <= items["maxLength"]
    if not values:
        return True
    lo, hi = min(values), max(values)  # NaN never reaches here: the JSON reader refuses it
    return ("minimum" not in items or lo >= items["minimum"]) and ("maximum" not in items or hi <= items["maximum"])


@lru_cache(maxsize=None)
def validator(name: str = RESULT_V1):
    import jsonschema
    from jsonschema import validators

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("integer", _strict_int).redefine("number", _number)
    plain_items = base.VALIDATORS["items"]

    def items(v, item_schema, instance, where):
        if isinstance(instance, list) and len(instance) > 64 and isinstance(item_schema, dict) \
                and _fast_ok(item_schema, instance):
            return
        yield from plain_items(v, item_schema, instance, where)

    cls = validators.extend(base, validators={"items": items}, type_checker=checker)
    return cls(schema(name))


def field_path(parts) -> str:
    """['cases', 0, 'variants', 1, 'samples_us', 0, 3] -> 'cases[0].variants[1].samples_us[0][3]'."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "document"


def _short(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10 ** 15:
        digits = len(str(abs(v)))  # JSON's reader refuses more than 4300 digits
        return f"{'-' if v < 0 else ''}1e{digits - 1} or so (a number of {digits} digits)"
    if isinstance(v, float) and abs(v) >= 1e6:
        return f"{v:g}"
    try:
        text = json.dumps(v) if not isinstance(v, str) else repr(v)
    except (RecursionError, ValueError, TypeError):
        text = f"a {type(v).__name__}"
    return printable(text, 40)


_TYPE_WORDS = {"object": "an object", "array": "a list", "string": "a string", "number": "a number",
               "integer": "a whole number", "boolean": "true or false", "null": "null"}


def message(error) -> str:
    """One short sentence for a jsonschema error, in taxes's words (never the whole offending value)."""
    v, kind, arg = error.instance, error.validator, error.validator_value
    if kind == "required":
        missing = [k for k in arg if isinstance(v, dict) and k not in v]
        return f"missing {missing[0]!r}" if missing else "a required key is missing"
    if kind == "type":
        want = " or ".join(_TYPE_WORDS.get(t, t) for t in (arg if isinstance(arg, list) else [arg]))
        return f"expected {want}, found {_json_type(v) if not isinstance(v, (int, float)) or isinstance(v, bool) else _short(v)}"
    if kind in ("minimum", "maximum"):
        side = "at least" if kind == "minimum" else "at most"
        return f"{_short(v)} is impossible here (must be {side} {arg:g})"
    if kind == "const":
        return f"expected {_short(arg)}, found {_short(v)}"
    if kind == "enum":
        return f"must be one of {', '.join(map(str, arg))}, found {_short(v)}"
    if kind == "maxLength":
        return f"longer than {arg} characters"
    if kind in ("maxItems", "maxProperties"):
        return f"more than {arg} entries"
    if kind == "minLength":
        return "must not be empty"
    return printable(error.message, 120)


def errors(doc, name: str = RESULT_V1) -> list[tuple[str, str]]:
    """Every (field path, message) where `doc` breaks the schema, the most relevant first."""
    from jsonschema.exceptions import relevance

    found = sorted(validator(name).iter_errors(doc), key=relevance)
    return [(field_path(e.absolute_path), message(e)) for e in found]


def check(doc, origin: str, name: str = RESULT_V1) -> None:
    """Raise one TaxesError line for the first problem: 'ORIGIN: FIELD: what is wrong'."""
    from jsonschema.exceptions import best_match

    err = best_match(validator(name).iter_errors(doc))
    if err is not None:
        where = field_path(err.absolute_path)
        raise TaxesError(printable(f"{origin}: {where}: {message(err)}", 600))
