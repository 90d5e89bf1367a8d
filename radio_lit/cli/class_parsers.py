"""jsonargparse's parsers of a class's signature, built once per process instead of once per use.

A ``radio-lit`` command parses, validates, instantiates and dumps every ``class_path`` value of
its config (teachers, callbacks, the student, the data, the optimizer); for each of these steps
jsonargparse 4.47 builds a new parser of the class's constructor
(``ActionTypeHint.get_class_parser``: the constructor's source parsed for its parameters, its
docstring for their help), and LightningCLI adds the trainer, the module and the data to each of
its four subcommands. The quickstart's one CLI build asks for 266 such parsers of 29 classes,
about 60 % of the build's CPU time. A jsonargparse parser is made to be used many times (the
top-level parser is), so :func:`install` makes jsonargparse keep them:

- the parser of a class (with the options, links and parent parser settings it was asked
  with) is built once and returned again;
- a callable's signature parameters (``get_signature_parameters``, as the signature parser
  reads them) are resolved once (a fresh copy of each parameter is returned);
- a docstring is parsed once per text and style.

What jsonargparse parses, the errors it raises and the config it writes are those of freshly
built parsers (``tests/cli/test_class_parsers.py`` compares them with :func:`uncached`). If the
installed jsonargparse lacks the functions patched here (another version), :func:`install`
leaves it as it is and commands only build slower.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jsonargparse import _common, _optionals, _signatures, _typehints

#: The functions replaced, as jsonargparse defines them: (module, name) -> function.
_ORIGINALS: dict[tuple[Any, str], Any] = {}
_PARSERS: dict[Any, Any] = {}
_SIGNATURES: dict[Any, list[Any]] = {}
_DOCSTRINGS: dict[Any, Any] = {}


def _frozen(value: Any) -> Any:
    """A hashable key equal for equal option values (dicts, lists, sets of hashable items);
    ``TypeError`` when a value cannot be hashed."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), _frozen(v)) for k, v in value.items()))))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(_frozen(v) for v in value))
    hash(value)
    return value


def _class_parser(
    val_class: Any, sub_add_kwargs: dict | None = None, skip_args: set | None = None
) -> Any:
    """``ActionTypeHint.get_class_parser``, built once per class, options, nested links and
    parent parser (its class, mode and logger)."""
    original = _ORIGINALS[(_typehints.ActionTypeHint, "get_class_parser")]
    if isinstance(val_class, str):
        val_class = _typehints.import_object(val_class)
    parent = _common.parent_parser.get()
    try:
        key = _frozen(
            (
                val_class,
                sub_add_kwargs,
                skip_args,
                _common.nested_links.get(),
                type(parent),
                getattr(parent, "parser_mode", None),
                getattr(parent, "logger", None),
                _typehints.allow_default_instance.get(),
            )
        )
    except TypeError:  # an option value that cannot be a key: build as jsonargparse does
        return original(val_class, sub_add_kwargs, skip_args)
    parser = _PARSERS.get(key)
    if parser is None:
        parser = _PARSERS[key] = original(val_class, sub_add_kwargs, skip_args)
    return parser


def _signature_parameters(
    function_or_class: Callable | type, method_or_property: str | None = None, logger: Any = True
) -> list[Any]:
    """``get_signature_parameters`` resolved once per callable and method; each call gets
    copies of the parameters (jsonargparse's callers may change them)."""
    original = _ORIGINALS[(_signatures, "get_signature_parameters")]
    try:
        key = (function_or_class, method_or_property)
        params = _SIGNATURES.get(key)
    except TypeError:  # not hashable
        return original(function_or_class, method_or_property, logger)
    if params is None:
        params = _SIGNATURES[key] = original(function_or_class, method_or_property, logger)
    return [dataclasses.replace(p) for p in params]


def _docstring(component: Any, params: bool = False, logger: Any = None) -> Any:
    """``parse_docstring`` once per docstring text and style (attribute docstrings, which
    read the source, are parsed each time as jsonargparse does)."""
    original = _ORIGINALS[(_optionals, "parse_docstring")]
    options = _optionals.get_docstring_parse_options()
    if params and options["attribute_docstrings"]:
        return original(component, params, logger)
    key = (getattr(component, "__doc__", None), options["style"])
    if key not in _DOCSTRINGS:
        _DOCSTRINGS[key] = original(component, params, logger)
    return _DOCSTRINGS[key]


#: (module or class, name, replacement, the original's parameter names).
_PATCHES = (
    (
        _typehints.ActionTypeHint,
        "get_class_parser",
        staticmethod(_class_parser),
        ["val_class", "sub_add_kwargs", "skip_args"],
    ),
    (
        _signatures,
        "get_signature_parameters",
        _signature_parameters,
        ["function_or_class", "method_or_property", "logger"],
    ),
    (_optionals, "parse_docstring", _docstring, ["component", "params", "logger"]),
)


def _patchable() -> bool:
    """Whether jsonargparse has the functions and context this module replaces and reads,
    with the parameters it calls them with."""
    for owner, name, _, parameters in _PATCHES:
        function = inspect.getattr_static(owner, name, None)
        function = getattr(function, "__func__", function)
        if not callable(function) or list(inspect.signature(function).parameters) != parameters:
            return False
    return all(
        hasattr(module, name)
        for module, name in (
            (_common, "parent_parser"),
            (_common, "nested_links"),
            (_typehints, "allow_default_instance"),
            (_typehints, "import_object"),
            (_optionals, "get_docstring_parse_options"),
        )
    )


def install() -> bool:
    """Make jsonargparse reuse class parsers, signatures and docstrings (idempotent);
    whether it does."""
    if _ORIGINALS:
        return True
    if not _patchable():
        return False
    for owner, name, replacement, _ in _PATCHES:
        _ORIGINALS[(owner, name)] = inspect.getattr_static(owner, name)
        setattr(owner, name, replacement)
    # The original of a static method, callable as a function.
    key = (_typehints.ActionTypeHint, "get_class_parser")
    _ORIGINALS[key] = _ORIGINALS[key].__func__
    return True


@contextmanager
def uncached() -> Iterator[None]:
    """jsonargparse as it is, with nothing kept, inside the block (for comparisons)."""
    if not _ORIGINALS:
        yield
        return
    for (owner, name), original in _ORIGINALS.items():
        setattr(owner, name, staticmethod(original) if isinstance(owner, type) else original)
    try:
        yield
    finally:
        for owner, name, replacement, _ in _PATCHES:
            setattr(owner, name, replacement)
