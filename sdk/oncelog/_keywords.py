"""Kafka's option names on Producer, Consumer and Admin, and a "did you mean"
for a misspelled one.

Users arrive with kafka-python's and confluent-kafka's habits:
`Producer(bootstrap_servers=...)`, or a config dict of Kafka's dotted
property names passed as `Producer(**{"bootstrap.servers": ...})`. Python
would answer both with a bare `TypeError: unexpected keyword argument`.
`kafka_names` wraps a client class's `__init__` so that

* a dotted name is read with `_` for `.` (`linger.ms` is `linger_ms`, as
  kafka-python spells Kafka's properties);
* a name Kafka's clients use for one of our options (`KAFKA_NAMES`, from
  the options table in oncelog.config_def) is taken as ours
  (`bootstrap_servers` is `bootstrap`);
* anything else unknown is a TypeError naming the keyword and, when one is
  close, the option it probably meant.

The wrapper keeps `__init__`'s own signature (`functools.wraps` sets
`__wrapped__`, which `inspect.signature` follows), so help(), the docs'
signature checks and type checkers still see our names only.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from oncelog import config_def

# Kafka's (and kafka-python's) name for an option -> ours, where they differ:
# from the clients' options table (oncelog.config_def). Only names whose
# meaning is the same here: a value given under the Kafka name is checked
# exactly as if given under ours.
KAFKA_NAMES: Mapping[str, str] = config_def.KAFKA_NAMES

C = TypeVar("C", bound=type)


def python_name(name: str) -> str:
    """A Kafka property name as a Python keyword: `linger.ms` -> `linger_ms`."""
    return name.replace(".", "_").replace("-", "_")


def resolve_keywords(owner: str, parameters: frozenset[str],
                     given: Mapping[str, Any]) -> dict[str, Any]:
    """`given` with every name turned into one of `parameters`; a TypeError
    naming the first that cannot be, with a suggestion when one is close."""
    resolved: dict[str, Any] = {}
    spelled: dict[str, str] = {}     # our name -> how the caller spelled it
    for name, value in given.items():
        ours = python_name(name)
        ours = KAFKA_NAMES.get(ours, ours)
        if ours not in parameters:
            raise TypeError(unknown_keyword_message(owner, name, parameters))
        if ours in resolved:
            raise TypeError(f"{owner}() got {ours!r} twice: as {spelled[ours]!r} and as {name!r}")
        resolved[ours] = value
        spelled[ours] = name
    return resolved


def unknown_keyword_message(owner: str, name: str, parameters: frozenset[str]) -> str:
    candidates = sorted(parameters | {k for k, v in KAFKA_NAMES.items() if v in parameters})
    close = difflib.get_close_matches(python_name(name), candidates, n=1, cutoff=0.6)
    hint = ""
    if close:
        suggestion = KAFKA_NAMES.get(close[0], close[0])
        hint = f"; did you mean {suggestion!r}?"
    return f"{owner}() got an unexpected keyword argument {name!r}{hint}"


def kafka_names(cls: C) -> C:
    """Class decorator: `cls.__init__` (keyword-only options) also takes
    Kafka's names for its options, and says "did you mean" for a misspelled one."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    compiled = not any(p.kind is inspect.Parameter.KEYWORD_ONLY
                       for p in signature.parameters.values())
    if compiled:
        signature = _compiled_signature(cls)
    parameters = frozenset(name for name, p in signature.parameters.items()
                           if p.kind is inspect.Parameter.KEYWORD_ONLY)
    owner = cls.__name__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **options: Any) -> None:  # noqa: N807 - the wrapped name
        if options.keys() <= parameters:
            init(self, *args, **options)     # the common case: our names only
            return
        init(self, *args, **resolve_keywords(owner, parameters, options))

    if compiled:
        # What inspect.signature(), help() and the docs' checks show.
        __init__.__signature__ = signature  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls



class _Default:
    """A default value as its source text, for a compiled __init__'s
    signature where the text is not a literal (a module constant)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _compiled_signature(cls: type) -> inspect.Signature:
    """`cls.__init__`'s signature where `cls` was compiled by mypyc
    (build_support/oncelog_build.py): a compiled __init__ has none to
    inspect, so it is read from the module's .py file, which the compiled
    wheel ships next to its extension (names, kinds and defaults; the
    annotations as their source text)."""
    # Found through the package: while a compiled module runs its body (as
    # kafka_names() does), its own __file__ is not yet the installed path.
    package, _, name = cls.__module__.rpartition(".")
    paths = list(getattr(sys.modules.get(package), "__path__", []))
    source = Path(paths[0]) / f"{name}.py" if paths else None
    if source is None or not source.is_file():
        raise RuntimeError(f"{cls.__qualname__}.__init__ has no signature to inspect and its "
                           f"source {source} is missing")
    text = source.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return _signature_of(item.args, text)
    raise RuntimeError(f"no {cls.__name__}.__init__ in {source}")


def _signature_of(args: ast.arguments, text: str) -> inspect.Signature:
    def default(node: ast.expr | None) -> Any:
        if node is None:
            return inspect.Parameter.empty
        try:
            return ast.literal_eval(node)
        except ValueError:
            return _Default(ast.get_source_segment(text, node) or "...")

    def annotation(node: ast.expr | None) -> Any:
        if node is None:
            return inspect.Parameter.empty
        return ast.get_source_segment(text, node) or inspect.Parameter.empty

    positional = args.posonlyargs + args.args
    pos_defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=default(d), annotation=annotation(a.annotation))
              for a, d in zip(positional, pos_defaults, strict=True)]
    params += [inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY,
                                 default=default(d), annotation=annotation(a.annotation))
               for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return inspect.Signature(params)
