"""Tokenizer and recursive-descent parser for one index-notation statement.

Grammar (lowest precedence first)::

    statement  := [ '(' NAME ')' ] NAME [ '[' [ expr (',' expr)* ] ']' ] ':=' expr
    expr       := conjunction (('|' | 'or') conjunction)*
    conjunction:= negation (('&' | 'and') negation)*
    negation   := ('not' | '~') negation | comparison
    comparison := sum [ ('<' | '<=' | '>' | '>=' | '==' | '!=') sum ]
    sum        := product (('+' | '-') product)*
    product    := unary (('*' | '/' | '//' | '%') unary)*
    unary      := ('-' | '+' | '~') unary | power                # '~' here: a factor's 'not'
    power      := primary [ ('**' | '^') unary ]           # right-associative
    primary    := NUMBER [NAME-started power]                # `2i` is 2 * i
                | NAME [ '[' args ']' | '(' args ')' ] | '(' expr ')'

The logical operators bind more loosely than comparisons (as Python's `and`, unlike its `&`),
so `j <= i & j > i - 8` is the conjunction of two comparisons; `and`, `or` and `not` are
words of the language, never names. A `~` where an operand is expected (`X[i] * ~(j < 2)`,
the place Python's own `~` takes) negates that operand, as tightly as a sign: `not` there
would be a syntax error in Python, and before this rule `~` there was one here too.

Every node carries `span`, the `(start, stop)` character offsets of its text. A statement
nests at most `MAX_DEPTH` levels (parentheses, index lists, function calls, signs, powers and
operators each count one), so that no later stage runs out of Python's recursion limit.

>>> s = parse("C[i,j] := A[i,k] * B[k,j]")
>>> s.output, [i.name for i in s.indices], s.body.op
('C', ['i', 'j'], '*')
>>> parse("(max) Y[i] := -X[i,k]^2").body
Unary(op='-', operand=Binary(op='**', ...), span=(14, 23))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

from tensordsl.errors import IndexExpressionError, ParseError
from tensordsl.frontend.foreign import foreign_literal, foreign_notation_hint

Span = tuple[int, int]

#: The deepest nesting a statement may have; deeper trees would exhaust Python's recursion
#: limit in lowering, differentiation or printing (nested calls fail from about 120 levels).
MAX_DEPTH = 64


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
    op: str  # '-', '+' or 'not' ('~' is read as 'not')
    operand: Expr
    span: Span


@dataclass(frozen=True)
class Binary:
    op: str  # '+', '-', '*', '/', '//', '%', '**' ('^' is read as '**'; `2i` as '*'),
    # or 'and', 'or' ('&' and '|' are read as them)
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
    #: `(topk 5)`: how many values a selection keeps, as written (and where).
    count: str | None = None
    count_span: Span | None = None


@dataclass(frozen=True)
class Token:
    kind: str  # 'number', 'name', 'op', 'bad' (a stray character, left to the parser), 'end'
    text: str
    span: Span


_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<ellipsis>\.\.\.)"
    r"|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[^\W\d]\w*)"  # Python's identifiers, unicode included: `α`, `Δt`
    r"|(?P<op>:=|\*\*|//|<=|>=|==|!=|[-+*/%^<>()\[\],&|~])"
    r"|(?P<bad>.)",
    re.DOTALL,
)
_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
#: The logical operators, each spelled as a symbol or a word, by the name nodes carry.
LOGICAL = {"|": "or", "or": "or", "&": "and", "and": "and", "~": "not", "not": "not"}


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
            # `...` (leading batch axes) reads as a name; the translator allows it only as
            # the first index of an index list
            kind = "name" if kind == "ellipsis" else kind
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
        self.depth = 0  # enclosing parentheses, index and argument lists, signs, exponents
        self.heights: dict[int, int] = {}  # id(node) -> height of its syntax tree

    def too_deep(self, span: Span) -> ParseError:
        return ParseError(
            f"the statement nests more than {MAX_DEPTH} levels deep",
            self.source,
            span,
            expected=f"at most {MAX_DEPTH} nested parentheses, index lists, function calls, "
            "signs, powers and operators",
            hint="split it into several kernels, or compute part of it with jax.numpy",
        )

    @contextmanager
    def nested(self, token: Token) -> Iterator[None]:
        """One level deeper (a parenthesis, index or argument list, sign or exponent)."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.too_deep(token.span)
        try:
            yield
        finally:
            self.depth -= 1

    def node(self, node: Expr, at: Span, *children: Expr) -> Expr:
        """Record `node`'s height; `at` is where to point when it is one level too deep."""
        height = 1 + max((self.heights.get(id(c), 0) for c in children), default=0)
        if height > MAX_DEPTH:
            raise self.too_deep(at)
        self.heights[id(node)] = height
        return node

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
            f"unexpected {_describe(token)} {context}",
            self.source,
            span,
            expected=expected,
            hint=foreign_notation_hint(self.source),
        )

    def expect(self, text: str, context: str, expected: str | None = None) -> Token:
        if not self.at(text):
            raise self.fail(context, expected or f"'{text}'")
        return self.next()

    def statement(self) -> Statement:
        reduction, reduction_span, count, count_span = None, None, None, None
        if self.at("(") and self.tokens[self.pos + 1].kind == "name":
            self.next()
            token = self.next()
            reduction, reduction_span = token.text, token.span
            if self.peek.kind == "number":  # `(topk 5)`: a selection's k
                count, count_span = self.peek.text, self.next().span
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
            count,
            count_span,
        )

    def arguments(self, open_: str, close: str, context: str) -> tuple[tuple[Expr, ...], int]:
        """`open_ expr, expr close`; returns the expressions and the end offset."""
        items: list[Expr] = []
        with self.nested(self.expect(open_, context)):
            if not self.at(close):
                items.append(self.expr())
                while self.at(","):
                    self.next()
                    items.append(self.expr())
        if not self.at(close):
            raise self.fail(context, f"',' or '{close}'")
        return tuple(items), self.next().span[1]

    def spanned(self, start: int) -> Span:
        """From `start` to the end of the last token read: a node's span includes the
        parentheses of an operand written in them (`1/(X[i]*0)`, `(A[i]+1)*2`)."""
        return (start, self.tokens[self.pos - 1].span[1])

    def logical(self, word: str) -> Token | None:
        """The next token when it is the logical operator `word` (a symbol or a word)."""
        token = self.peek
        if token.kind in ("op", "name") and LOGICAL.get(token.text) == word:
            return token
        return None

    def expr(self) -> Expr:
        return self.joined("or", self.conjunction)

    def conjunction(self) -> Expr:
        return self.joined("and", self.negation)

    def joined(self, word: str, operand: Callable[[], Expr]) -> Expr:
        """`operand (word operand)*`, left-associative."""
        start = self.peek.span[0]
        left = operand()
        while (token := self.logical(word)) is not None:
            self.next()
            right = operand()
            binary = Binary(word, left, right, self.spanned(start))
            left = self.node(binary, token.span, left, right)
        return left

    def negation(self) -> Expr:
        token = self.logical("not")
        if token is None:
            return self.comparison()
        self.next()
        with self.nested(token):
            operand = self.negation()
        unary = Unary("not", operand, self.spanned(token.span[0]))
        return self.node(unary, token.span, operand)

    def comparison(self) -> Expr:
        start = self.peek.span[0]
        left = self.sum()
        if self.at(*_COMPARISONS):
            token = self.next()
            right = self.sum()
            if self.at(*_COMPARISONS):
                raise self.fail("after a comparison", "parentheses: comparisons do not chain")
            compare = Compare(token.text, left, right, self.spanned(start))
            return self.node(compare, token.span, left, right)
        return left

    def sum(self) -> Expr:
        start = self.peek.span[0]
        left = self.product()
        while self.at("+", "-"):
            token = self.next()
            right = self.product()
            binary = Binary(token.text, left, right, self.spanned(start))
            left = self.node(binary, token.span, left, right)
        return left

    def product(self) -> Expr:
        start = self.peek.span[0]
        left = self.unary()
        while self.at("*", "/", "//", "%"):
            token = self.next()
            right = self.unary()
            binary = Binary(token.text, left, right, self.spanned(start))
            left = self.node(binary, token.span, left, right)
        return left

    def unary(self) -> Expr:
        if self.at("-", "+", "~"):
            token = self.next()
            with self.nested(token):
                operand = self.unary()
            op = LOGICAL.get(token.text, token.text)
            unary = Unary(op, operand, self.spanned(token.span[0]))
            return self.node(unary, token.span, operand)
        return self.power()

    def power(self) -> Expr:
        start = self.peek.span[0]
        base = self.primary()
        if self.at("**", "^"):
            token = self.next()
            with self.nested(token):
                exponent = self.unary()
            power = Binary("**", base, exponent, self.spanned(start))
            return self.node(power, token.span, base, exponent)
        return base

    def primary(self) -> Expr:
        token = self.peek
        if token.kind == "number":
            self.next()
            number = Number(token.text, token.span)
            if self.peek.kind == "name" and self.peek.span[0] == token.span[1]:
                literal = foreign_literal(token.text, self.peek.text)
                if literal is not None:  # `0x1F`, `1_000`: not `0 * x1F`, `1 * _000`
                    span = (token.span[0], self.peek.span[1])
                    raise ParseError(literal[0], self.source, span, expected=literal[1])
                factor = self.power()  # `2i^2` is 2 * i^2
                product = Binary("*", number, factor, self.spanned(token.span[0]))
                return self.node(product, token.span, factor)
            return number
        if token.kind == "name":
            return self.named()
        if self.at("("):
            with self.nested(self.next()):
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
            access = Access(token.text, indices, (token.span[0], end), token.span)
            return self.node(access, token.span, *indices)
        if self.at("("):
            args, end = self.arguments("(", ")", f"in the arguments of '{token.text}'")
            call = Call(token.text, args, (token.span[0], end), token.span)
            return self.node(call, token.span, *args)
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
