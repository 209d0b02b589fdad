"""Tokenizer and recursive-descent parser for one index-notation statement.

Grammar (lowest precedence first)::

    statement  := [ '(' NAME ')' ] NAME [ '[' [ expr (',' expr)* ] ']' ] ':=' expr
    expr       := sum [ ('<' | '<=' | '>' | '>=' | '==' | '!=') sum ]
    sum        := product (('+' | '-') product)*
    product    := unary (('*' | '/') unary)*
    unary      := ('-' | '+') unary | power
    power      := primary [ ('**' | '^') unary ]           # right-associative
    primary    := NUMBER [NAME-started power]                # `2i` is 2 * i
                | NAME [ '[' args ']' | '(' args ')' ] | '(' expr ')'

Every node carries `span`, the `(start, stop)` character offsets of its text.

>>> s = parse("C[i,j] := A[i,k] * B[k,j]")
>>> s.output, [i.name for i in s.indices], s.body.op
('C', ['i', 'j'], '*')
>>> parse("(max) Y[i] := -X[i,k]^2").body
Unary(op='-', operand=Binary(op='**', ...), span=(14, 23))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

from tensordsl.errors import IndexExpressionError, ParseError

Span = tuple[int, int]


@dataclass(frozen=True)
class Number:
    text: str
    span: Span


@dataclass(frozen=True)
class Name:
    name: str
    span: Span


@dataclass(frozen=True)
class Access:
    """`A[i, k+1]`: a tensor read with one index expression per axis."""

    name: str
    indices: tuple[Expr, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Expr, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True)
class Unary:
    op: str  # '-' or '+'
    operand: Expr
    span: Span


@dataclass(frozen=True)
class Binary:
    op: str  # '+', '-', '*', '/', '**' ('^' is read as '**'; `2i` as '*')
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True)
class Compare:
    op: str  # '<', '<=', '>', '>=', '==', '!='
    left: Expr
    right: Expr
    span: Span


Expr = Union[Number, Name, Access, Call, Unary, Binary, Compare]  # noqa: UP007


@dataclass(frozen=True)
class Statement:
    """`(reduction) OUT[indices] := body`; `indices` is None when the left has no brackets."""

    output: str
    indices: tuple[Expr, ...] | None
    body: Expr
    reduction: str | None
    source: str
    span: Span
    output_span: Span
    reduction_span: Span | None = None


@dataclass(frozen=True)
class Token:
    kind: str  # 'number', 'name', 'op', 'bad' (a stray character, left to the parser), 'end'
    text: str
    span: Span


_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z_0-9]*)"
    r"|(?P<op>:=|\*\*|<=|>=|==|!=|[-+*/^<>()\[\],])"
    r"|(?P<bad>.)",
    re.DOTALL,
)
_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


def tokenize(source: str) -> tuple[Token, ...]:
    """Split `source` into tokens, ending with an 'end' token.

    >>> [t.text for t in tokenize("Y[2i] := x**2")]
    ['Y', '[', '2', 'i', ']', ':=', 'x', '**', '2', '']
    """
    tokens = []
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        assert match is not None  # the 'bad' group matches any character
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append(Token(kind, match.group(), match.span()))
        pos = match.end()
    tokens.append(Token("end", "", (len(source), len(source))))
    return tuple(tokens)


def _describe(token: Token) -> str:
    return "end of input" if token.kind == "end" else repr(token.text)


class _Parser:
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def at(self, *texts: str) -> bool:
        return self.peek.kind == "op" and self.peek.text in texts

    def fail(self, context: str, expected: str) -> ParseError:
        token = self.peek
        span = token.span if token.kind != "end" else (token.span[0], token.span[0] + 1)
        return ParseError(
            f"unexpected {_describe(token)} {context}", self.source, span, expected=expected
        )

    def expect(self, text: str, context: str, expected: str | None = None) -> Token:
        if not self.at(text):
            raise self.fail(context, expected or f"'{text}'")
        return self.next()

    def statement(self) -> Statement:
        reduction, reduction_span = None, None
        if self.at("(") and self.tokens[self.pos + 1].kind == "name":
            self.next()
            token = self.next()
            reduction, reduction_span = token.text, token.span
            self.expect(")", "after the reduction name")
        if self.peek.kind != "name":
            raise self.fail("at the start of the statement", "the output name, as in 'Y[i] := ...'")
        out = self.next()
        indices = None
        if self.at("["):
            indices = self.arguments("[", "]", f"in the index list of '{out.text}'")[0]
        self.expect(
            ":=",
            f"after '{self.source[out.span[0] : self.tokens[self.pos - 1].span[1]]}'",
            "':=' between the output and its definition",
        )
        body = self.expr()
        if self.peek.kind != "end":
            raise self.fail("after the end of the expression", "an operator or end of input")
        start = reduction_span[0] - 1 if reduction_span else out.span[0]
        return Statement(
            out.text,
            indices,
            body,
            reduction,
            self.source,
            (start, len(self.source)),
            out.span,
            reduction_span,
        )

    def arguments(self, open_: str, close: str, context: str) -> tuple[tuple[Expr, ...], int]:
        """`open_ expr, expr close`; returns the expressions and the end offset."""
        self.expect(open_, context)
        items: list[Expr] = []
        if not self.at(close):
            items.append(self.expr())
            while self.at(","):
                self.next()
                items.append(self.expr())
        if not self.at(close):
            raise self.fail(context, f"',' or '{close}'")
        return tuple(items), self.next().span[1]

    def expr(self) -> Expr:
        left = self.sum()
        if self.at(*_COMPARISONS):
            op = self.next().text
            right = self.sum()
            if self.at(*_COMPARISONS):
                raise self.fail("after a comparison", "parentheses: comparisons do not chain")
            return Compare(op, left, right, (left.span[0], right.span[1]))
        return left

    def sum(self) -> Expr:
        left = self.product()
        while self.at("+", "-"):
            op = self.next().text
            right = self.product()
            left = Binary(op, left, right, (left.span[0], right.span[1]))
        return left

    def product(self) -> Expr:
        left = self.unary()
        while self.at("*", "/"):
            op = self.next().text
            right = self.unary()
            left = Binary(op, left, right, (left.span[0], right.span[1]))
        return left

    def unary(self) -> Expr:
        if self.at("-", "+"):
            token = self.next()
            operand = self.unary()
            return Unary(token.text, operand, (token.span[0], operand.span[1]))
        return self.power()

    def power(self) -> Expr:
        base = self.primary()
        if self.at("**", "^"):
            self.next()
            exponent = self.unary()
            return Binary("**", base, exponent, (base.span[0], exponent.span[1]))
        return base

    def primary(self) -> Expr:
        token = self.peek
        if token.kind == "number":
            self.next()
            number = Number(token.text, token.span)
            if self.peek.kind == "name" and self.peek.span[0] == token.span[1]:
                factor = self.power()  # `2i^2` is 2 * i^2
                return Binary("*", number, factor, (token.span[0], factor.span[1]))
            return number
        if token.kind == "name":
            return self.named()
        if self.at("("):
            self.next()
            inner = self.expr()
            if not self.at(")"):
                raise self.fail("inside parentheses", "')'")
            self.next()
            return inner
        raise self.fail("in an expression", "a number, a name or '('")

    def named(self) -> Expr:
        token = self.next()
        if self.at("["):
            indices, end = self.arguments("[", "]", f"in the index list of '{token.text}'")
            if self.at("["):
                raise IndexExpressionError(
                    f"'{token.text}' is indexed twice",
                    self.source,
                    (token.span[0], end),
                    expected=f"one index list, as in '{token.text}[i, j]'",
                )
            return Access(token.text, indices, (token.span[0], end), token.span)
        if self.at("("):
            args, end = self.arguments("(", ")", f"in the arguments of '{token.text}'")
            return Call(token.text, args, (token.span[0], end), token.span)
        return Name(token.text, token.span)


@lru_cache(maxsize=1024)
def parse(source: str) -> Statement:
    """Parse one statement into a syntax tree.

    Args:
        source: e.g. `"C[i,j] := A[i,k] * B[k,j]"`, optionally prefixed by `(max)`.

    Returns:
        The `Statement`, a frozen tree whose nodes carry source spans.

    Raises:
        ParseError: the text is not a statement (the message points at the offending token).

    >>> parse("Y[i] := X[2i+1]").body.indices[0]
    Binary(op='+', left=Binary(op='*', left=Number(text='2', span=(10, 11)), ...
    """
    return _Parser(source).statement()
