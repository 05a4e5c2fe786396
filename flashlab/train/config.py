"""Configuration dataclasses that check themselves and turn into command-line options.

Every field is declared with `option`: its default, one line of help, and what values make
sense (choices, a range). `check_fields` enforces those; the command line (``python -m
flashlab``) builds one flag per field from the same declaration, so ``--help`` lists every
choice and range, and a bad value is refused before any work starts.

A field's ``on_resume`` says what resuming a checkpoint does with it: "fixed" fields define
the model or the task and must equal the checkpoint's (`resume_mismatches`), "free" ones
(steps, time limit, learning rate, logging …) may change and take effect.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from dataclasses import field


class ConfigError(ValueError):
    """A configuration value that cannot work. ``field`` names it; the message starts with
    ``field:`` and says how to fix it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.reason = message


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage block) that points to --help: every
    flashlab command (``python -m flashlab …``) parses with it."""

    def error(self, message):
        message = message.removeprefix("argument ")                  # "--lr: …", like every other error
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def option(default, help: str, *, choices=None, low=None, high=None, low_open: bool = False,
           high_open: bool = False, on_resume: str = "free"):
    """A dataclass field with its help line, allowed values and resume rule. ``low``/``high``:
    bounds, inclusive unless ``low_open``/``high_open``."""
    if on_resume not in ("fixed", "free"):
        raise ValueError(f"on_resume: {on_resume!r} is not 'fixed' or 'free'.")
    return field(default=default, metadata={"help": help, "choices": choices, "low": low, "high": high,
                                            "low_open": low_open, "high_open": high_open, "on_resume": on_resume})


def describe_range(meta) -> str:
    low, high = meta["low"], meta["high"]
    if low is None and high is None:
        return ""
    left = "(" if meta["low_open"] else "["
    right = ")" if meta["high_open"] else "]"
    if high is None:
        return f"> {low}" if meta["low_open"] else f"≥ {low}"
    if low is None:
        return f"< {high}" if meta["high_open"] else f"≤ {high}"
    return f"in {left}{low}, {high}{right}"


def field_kind(f) -> type:
    """The Python type a field holds (int, float, bool or str; ``X | None`` → X). The annotation
    is a string in a module with ``from __future__ import annotations`` and the type itself in
    one without: both are read."""
    annotation = f.type
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        for name, kind in (("bool", bool), ("int", int), ("float", float)):
            if text in (name, f"{name}|None", f"Optional[{name}]", f"typing.Optional[{name}]"):
                return kind
        return str
    held = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return held[0] if len(held) == 1 and held[0] in (bool, int, float) else str


def check_value(f, value) -> None:
    """Raise ConfigError unless ``value`` suits field ``f`` (type, choices, range)."""
    meta, kind = f.metadata, field_kind(f)
    if value is None and "None" in str(f.type):
        return
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f.name, f"{value!r} is not True or False.")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f.name, f"{value!r} is not an integer.")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f.name, f"{value!r} is not a finite number.")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f.name, f"{value!r} is not a string.")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f.name, f"{value!r} is not one of {', '.join(map(str, meta['choices']))}.")
    low, high = meta.get("low"), meta.get("high")
    too_low = low is not None and (value <= low if meta["low_open"] else value < low)
    too_high = high is not None and (value >= high if meta["high_open"] else value > high)
    if too_low or too_high:
        raise ConfigError(f.name, f"{value} is out of range; give a value {describe_range(meta)}.")


def check_fields(config) -> None:
    """Check every field of a dataclass built from `option` fields."""
    for f in dataclasses.fields(config):
        if "help" in f.metadata:
            check_value(f, getattr(config, f.name))


class FieldsChecked:
    """Base of the option dataclasses: each field's value is checked when the config is built
    (``RunConfig(steps=0)`` raises there, not later when a Trainer is made from it), and again by
    ``dataclasses.replace``. The checks across fields and against the machine (d_model divisible
    by n_heads, a visible GPU) stay in each class's ``check()``, run when training starts: a
    config may be written on one machine for another."""

    def __post_init__(self) -> None:
        check_fields(self)


def resume_mismatches(config, stored: dict) -> list[str]:
    """One line per "fixed" field whose value differs from the checkpoint's ``stored`` dict."""
    lines = []
    for f in dataclasses.fields(config):
        if f.metadata.get("on_resume") == "fixed" and f.name in stored and stored[f.name] != getattr(config, f.name):
            lines.append(f"{f.name} is {getattr(config, f.name)!r} but the checkpoint has {stored[f.name]!r}")
    return lines


def stored_problem(config_class, stored, whole: bool = True) -> str | None:
    """What is wrong with ``stored``, a checkpoint's settings for ``config_class``, or None: the
    checks the command line applies to an option (type, choices, range) on every field, an unknown
    setting, and with ``whole`` the class's checks across fields (``check()``: d_model divisible by
    n_heads …). A setting the checkpoint lacks takes its default, as for a file of an older flashlab."""
    if not isinstance(stored, dict):
        return f"a {type(stored).__name__} where a dict of settings belongs"
    names = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(str(k) for k in stored if k not in names)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        return f"{unknown[0]!r}{more} is no setting of {config_class.__name__}"
    try:
        config = config_class(**stored)
        if whole and hasattr(config, "check"):
            config.check()
    except ConfigError as exc:
        return f"{exc.field}: {exc.reason.rstrip('.')}"
    return None


def owner_of(name: str, *configs):
    """The first of ``configs`` that has a field ``name``."""
    for config in configs:
        if name in {f.name for f in dataclasses.fields(config)}:
            return config
    names = sorted({f.name for c in configs for f in dataclasses.fields(c)})
    raise ConfigError(name, f"no such setting; the settings are: {', '.join(names)}.")


def apply_changes(configs: tuple, changes: dict) -> tuple:
    """``configs`` with each of ``changes`` applied to the config that owns the field."""
    configs = list(configs)
    for name, value in changes.items():
        owner = owner_of(name, *configs)
        i = next(i for i, c in enumerate(configs) if c is owner)
        configs[i] = dataclasses.replace(owner, **{name: value})
    return tuple(configs)
