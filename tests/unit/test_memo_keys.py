"""`memo.key_text`: dataclasses printed completely, hashable ones once per process."""

from dataclasses import dataclass

from codegen.cache import memo
from codegen.ir.nest import index_symbol


@dataclass(frozen=True)
class Frozen:
    index: object
    size: int


@dataclass
class Mutable:  # unhashable: printed each time
    values: list


def test_a_frozen_dataclass_is_printed_once_and_completely():
    i = index_symbol("i")
    before = memo._record_text.cache_info().misses
    first = memo.key_text(Frozen(i, 3))
    assert first == memo.key_text(Frozen(i, 3)) == f"Frozen(index={memo.key_text(i)}, size=3)"
    assert memo._record_text.cache_info().misses == before + 1
    assert memo.key_text(Frozen(i, 4)) != first


def test_an_unhashable_dataclass_is_printed_as_well():
    assert memo.key_text(Mutable([1, 2])) == "Mutable(values=(1, 2,))"
    assert memo.digest_of(Mutable([1, 2])) != memo.digest_of(Mutable([1, 3]))
