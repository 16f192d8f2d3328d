"""The stages' settings objects, their config fields made from the key table (eagle3build.config.spec), so that no
settings class restates a key's type, default or choices.

``config_fields(fields)`` makes a class a frozen dataclass: the class's own annotated fields (the job's files,
its GPUs, values the contract or the compat report decides) as written there, and one keyword-only field per
entry of ``fields`` (field name -> dotted key path, ``{"dtype": "target.serve_dtype"}``; a sequence of paths
names each field by the key's last part) with the key's Python type (``Key.python_type``) and its default
(config.yaml's value; a fresh copy for a list or a mapping). An entry whose value is such a class is a section
field (``{"train": TrainConfig}``): an object of that class, made from the same settings (default: its defaults;
a mapping given for it becomes one). ``settings_class`` makes such a class with config fields only
(``train.trainer.TrainConfig``, from ``section_fields("train")``). Each class gets

- ``CONFIG_KEYS``: its config fields, field name -> key path; ``SECTIONS``: its section fields, name -> class;
- ``from_settings(settings, **fields)``: the object of one job, each config field read from ``settings`` (the
  stage's ``workflow.contract.StageSettings``, which raises KeyError for a key outside the stage's contract, or
  any mapping of key paths), each section field made from them too, the class's own fields given (a stage's job:
  ``workflow.job.stage_settings``, each as its ``job(...)`` source says);
- a check at construction: a config field's value outside its key's ``enum`` raises ValueError naming the key;
- a docstring that lists the config fields, each with its key, default and doc.

A function that takes one key's value outside such an object defaults it with ``declared(path)``, or takes no
default where its caller always passes the job's value.

tests/test_settings.py finds every such class of the stages and checks that no other field or keyword default
in the package restates a declared key's default (its ``ALLOWED``: the few of the floor below ``config``, which
cannot import this module).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Callable

from .spec import KEYS, Key, key, section_keys


def section_fields(section: str, keys: tuple[Key, ...] = KEYS) -> dict[str, str]:
    """Field name -> key path of every key directly under ``section`` (``"train"``), named by its last part, in
    declaration order."""
    return {k.name: k.path for k in section_keys(section, keys)}


def _named(fields: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(fields, Mapping):
        return dict(fields)
    return {path.rsplit(".", 1)[-1]: path for path in fields}


def _field(k: Key) -> dataclasses.Field:
    if isinstance(k.default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=k.default: copy.deepcopy(d), kw_only=True)
    return dataclasses.field(default=k.default, kw_only=True)


def declared(path: str, keys: tuple[Key, ...] = KEYS) -> Any:
    """The declared default of config key ``path`` (a fresh copy): the keyword default of a function that takes the
    key's value (``unfinished: str = declared("data.regenerate.unfinished")``), never a copy of the value.

    Raises:
        KeyError: ``path`` is not a key of ``keys``.
    """
    return copy.deepcopy(key(path, keys).default)


def job(source: str, **field: Any) -> Any:
    """A settings class's own field whose value the job gives (``workflow.job.stage_settings``): ``source`` as
    ``workflow.job_fields.JobField`` reads it (``job("outputs.json")``; ``job("resources.gpu?", default=0)``:
    optional, the default where the job gives none); ``field``: ``dataclasses.field``'s keywords. The stage's contract
    reads the sources from the class's source text (``workflow.stages``), so a source is a string literal."""
    return dataclasses.field(metadata={"job": source}, **field)


def check_choices(obj: Any, by_field: Mapping[str, Key]) -> None:
    """Check each config field of ``obj`` (``by_field``: field name -> its key) against its key's ``enum``.

    Raises:
        ValueError: a value outside the choices (``train.select 'first' is not one of ['best_simulated_tau',
            'last']``).
    """
    for name, k in by_field.items():
        choices = k.schema.get("enum")
        if choices is not None and getattr(obj, name) not in choices:
            raise ValueError(f"{k.path} {getattr(obj, name)!r} is not one of {list(choices)}")


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name`` (a fresh one of a ``default_factory``).

    Raises:
        KeyError: no such field, or it has no default.
    """
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise KeyError(f"{cls.__name__}.{name} has no default")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def config_fields(fields: Mapping[str, str | type] | Iterable[str], keys: tuple[Key, ...] = KEYS
                  ) -> Callable[[type], type]:
    """A class decorator: the class as a frozen dataclass with its own annotated fields and a keyword-only config
    field per entry of ``fields`` (field name -> key path of ``keys``, or key paths named by their last part; or
    field name -> a class made by this decorator: a section field); the module docstring says what the class gets.

    Raises:
        KeyError: a path of ``fields`` is not a key of ``keys`` (when the class is made).
        TypeError: the class declares a config field itself (its default would restate the key's), or a section
            field's class is not made by this decorator.
    """
    named = _named(fields)
    sections = {name: sub for name, sub in named.items() if isinstance(sub, type)}
    for name, sub in sections.items():
        if "CONFIG_KEYS" not in vars(sub):
            raise TypeError(f"section field {name}: {sub.__name__} is not made by config_fields")
    by_field = {name: key(path, keys) for name, path in named.items() if name not in sections}

    def make(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        for name in [*by_field, *sections]:
            if name in own or name in cls.__dict__:
                what = f"config key {by_field[name].path}'s" if name in by_field else f"section {name}'s"
                raise TypeError(f"{cls.__name__}.{name} is {what} field: its type and default come "
                                "from the key's declaration (eagle3build/config/), not from the class")
        for name, k in by_field.items():
            own[name] = k.python_type()
            setattr(cls, name, _field(k))
        for name, sub in sections.items():
            own[name] = sub
            setattr(cls, name, dataclasses.field(default_factory=sub, kw_only=True))
        cls.__annotations__ = own
        cls.CONFIG_KEYS = MappingProxyType({name: k.path for name, k in by_field.items()})
        cls.SECTIONS = MappingProxyType(dict(sections))
        after = getattr(cls, "__post_init__", None)

        def __post_init__(self) -> None:
            check_choices(self, by_field)
            for name, sub in sections.items():
                if isinstance(getattr(self, name), Mapping):  # a section's fields as JSON (a torchrun rank's)
                    object.__setattr__(self, name, sub(**getattr(self, name)))
            if after is not None:
                after(self)

        cls.__post_init__ = __post_init__
        cls.from_settings = classmethod(_from_settings)
        listing = "\n".join([*(f"- ``{name}`` (``{k.path}``, default ``{k.default!r}``): {k.doc}"
                                for name, k in by_field.items()),
                              *(f"- ``{name}``: a ``{sub.__name__}``, its config fields from the same settings"
                                for name, sub in sections.items())])
        cls.__doc__ = ((cls.__doc__ or "").rstrip() + "\n\nConfig fields (keyword-only; type, default and choices from "
                       "the key's declaration, eagle3build/config/):\n\n" + listing)
        return dataclasses.dataclass(frozen=True)(cls)

    return make


def _from_settings(cls: type, settings: Mapping[str, Any], /, **fields: Any) -> Any:
    """An object of ``cls``: each config field read from ``settings`` by its key path (a stage's
    ``StageSettings``), each section field made from them (its class's ``from_settings``), the class's own fields
    from ``fields``.

    Raises:
        KeyError: ``settings`` lacks one of the keys (a ``StageSettings``: the key is outside the stage's contract).
        TypeError: ``fields`` names a config or section field, or lacks one of the class's own fields without a
            default.
        ValueError: a value outside its key's choices.
    """
    made = {name: sub.from_settings(settings) for name, sub in cls.SECTIONS.items()}
    return cls(**{name: settings[path] for name, path in cls.CONFIG_KEYS.items()}, **made, **fields)


def settings_class(name: str, fields: Mapping[str, str] | Iterable[str], keys: tuple[Key, ...] = KEYS, *,
                   bases: tuple[type, ...] = (), module: str | None = None, doc: str = "") -> type:
    """A frozen dataclass ``name`` of config fields only (``config_fields``), with ``bases`` (methods, no fields)
    and ``doc``, defined in ``module``.

    Raises:
        as ``config_fields``.
    """
    cls = type(name, bases, {"__doc__": doc, "__module__": module or __name__, "__qualname__": name})
    return config_fields(fields, keys)(cls)
