"""The command line of every command here: ``--name=value`` options built from a dataclass's fields (their
defaults and the comments beside them as help), and a parser that refuses bad input in one line."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import io
import textwrap
import tokenize
import types
import typing

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _converter(tp):
    """A str -> value function for a field type; lists and tuples are comma-separated."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X], or X | str: X where the text is one, else the word
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 2 and str in args:
            return _or_word(_converter(next(a for a in args if a is not str)))
        return _converter(args[0])
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (str,)
        conv = _converter(inner)
        seq = list if origin is list else tuple
        return lambda text: seq(conv(x) for x in text.split(",") if x.strip() != "")
    if tp is bool:
        return _parse_bool
    if tp in (int, float, str):
        return tp
    raise TypeError(f"unsupported field type {tp!r} for the command line")


def _or_word(convert):
    def either(text: str):
        try:
            return convert(text)
        except ValueError:
            return text.strip()

    return either


_GLUE = "\u00a0"  # a space neither argparse nor textwrap breaks a line at


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but never breaking a line inside ``(default: ...)``, so that a default reads (and greps) whole."""

    def _split_lines(self, text, width):
        glued = text.replace("(default: ", f"(default:{_GLUE}")
        return [line.replace(_GLUE, " ") for line in super()._split_lines(glued, width)]


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser for every command line here: an option it refuses (unknown, malformed, a bad value)
    ends as one line ``<prog>: error: <message>`` on stderr and exit status 2, without the usage block (``--help``
    shows it); an unknown option names the closest known one (difflib)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(self.unknown(extra[0]))
        return ns

    def unknown(self, arg: str) -> str:
        """The message for an argument no option takes: for an option, the closest one ``--help`` lists, if any."""
        if not arg.startswith("-"):
            return f"unexpected argument {arg!r}"
        name = arg.split("=", 1)[0]
        known = sorted(
            o
            for o, action in self._option_string_actions.items()
            if o.startswith("--") and action.help is not argparse.SUPPRESS
        )
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "see --help for the options"
        return f"unknown option {arg!r}; {hint}"

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_dataclass_arguments(
    parser: argparse.ArgumentParser, cls, defaults: dict | None = None, hidden: typing.Collection[str] = ()
) -> argparse.ArgumentParser:
    """Add one ``--name=value`` option per field of dataclass ``cls`` (default: ``defaults``' value, else the
    field's); ``--help`` shows the field's comment (:func:`field_comments`) and its default. ``hidden`` fields are
    parsed but left out of ``--help``, for a command that takes fewer options than its dataclass has and refuses
    the others itself."""
    hints, comments = typing.get_type_hints(cls), field_comments(cls)
    for f in dataclasses.fields(cls):
        required = False
        if f.name in (defaults or {}):
            default = defaults[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default, required = None, True
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else repr(default)
        about = f.metadata.get("help") or comments.get(f.name, "")
        text = " ".join(filter(None, (about, "(required)" if required else f"(default: {shown})")))
        tp = hints[f.name]
        metavar = "A,B,..." if typing.get_origin(tp) in (list, tuple) else getattr(tp, "__name__", "VALUE")
        parser.add_argument(
            f"--{f.name}",
            type=_converter(tp),
            default=default,
            required=required,
            metavar=metavar,
            help=argparse.SUPPRESS if f.name in hidden else text.replace("%", "%%"),
        )
    return parser


def field_comments(cls) -> dict[str, str]:
    """Each field's description, read from the source of the class declaring it: the comment ending the field's
    line, else the comment lines right above it. A field is so described once, beside its default; a subclass that
    redeclares a field without a comment keeps its base's. Fields of a class without source get none."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            try:
                comments.update(_declared_comments(textwrap.dedent(inspect.getsource(klass))))
            except (OSError, TypeError, SyntaxError, tokenize.TokenError):  # no source, or not all of it
                continue
    return comments


def _declared_comments(source: str) -> dict[str, str]:
    """``name -> comment`` for each ``name: type ...`` statement in the body of the class whose source this is."""
    found, alone, statement, trailing, depth = {}, {}, [], [], 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if statement:
                trailing.append(text)
            else:
                alone[tok.start[0]] = text
        elif tok.type == tokenize.NEWLINE:
            if depth == 1 and len(statement) > 1 and statement[0].type == tokenize.NAME and statement[1].string == ":":
                row, above = statement[0].start[0], []
                while row - 1 - len(above) in alone:
                    above.insert(0, alone[row - 1 - len(above)])
                if trailing or above:
                    found[statement[0].string] = trailing[0] if trailing else " ".join(above)
            statement, trailing = [], []
        elif tok.type not in (tokenize.NL, tokenize.ENDMARKER):
            statement.append(tok)
    return found


def dataclass_from_namespace(cls, ns: argparse.Namespace):
    """Build ``cls`` from the matching attributes of an argparse namespace."""
    return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)})


def parse_dataclass(cls, argv: typing.Sequence[str] | None = None, prog: str | None = None):
    """Parse ``--key=value`` overrides of ``cls``'s defaults; unknown keys are an error."""
    parser = add_dataclass_arguments(OneLineParser(prog=prog, description=cls.__doc__), cls)
    return dataclass_from_namespace(cls, parser.parse_args(argv))
