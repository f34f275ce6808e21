"""How an inference job runs: the config's ``inference`` settings, each with its type, bounds and default.

They are written down once, here, in the words of a JSON schema, so that a job started by hand (the
``verbmirage predict`` commands, :class:`~verbmirage.inference.runs.RunSpec`) takes the defaults and meets the
bounds a planned job does. ``schemas/config.schema.yaml`` repeats the block, as the documentation users read and
to fill a config's defaults; a test keeps the two equal.
"""

from __future__ import annotations

from verbmirage.variants.settings import non_finite_numbers

#: ``inference.<key>`` -> its JSON schema (type, bounds, default).
INFERENCE_SETTINGS: dict[str, dict] = {
    # rows per forward; auto: sized from a GPU's free memory, 64 on the CPU (verbmirage.inference.sizing)
    "batch_size": {"anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}], "default": "auto"},
    "shards": {"type": "integer", "minimum": 1, "default": 1},
    "part_size": {"type": "integer", "minimum": 1, "default": 512},
    "max_error_share": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.05},
    "continue_tokens": {"type": "integer", "minimum": 0, "default": 8},
}
#: ``inference.<key>`` -> its default.
INFERENCE_DEFAULTS: dict = {key: schema["default"] for key, schema in INFERENCE_SETTINGS.items()}


def inference_problem(key: str, value) -> str | None:
    """Why ``value`` cannot be config key ``inference.<key>`` (its type and bounds, or not a finite number), in
    the words of the config check; None when it can.

    A job started by hand meets the bounds a planned one does: a ``part_size`` of 0 would write an empty row
    group forever, a ``batch_size`` of 0 or less asks nothing.
    """
    import jsonschema  # deferred: only a job's settings are checked with it

    where = f"inference.{key}"
    problems = non_finite_numbers(value, where)
    if problems:
        return problems[0]
    schema = INFERENCE_SETTINGS[key]
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is not None and error.validator == "anyOf":  # batch_size: a number or auto
        return f"{where}: {value!r} is neither a whole number >= 1 nor 'auto'"
    return None if error is None else f"{where}: {error.message}"


def check_inference_settings(**values) -> None:
    """:func:`inference_problem` for each ``key=value``: a ``ValueError`` naming the first key that is wrong."""
    for key, value in values.items():
        problem = inference_problem(key, value)
        if problem:
            raise ValueError(problem)
