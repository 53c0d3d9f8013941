"""The shape book and the shapes it hands a plan: bulk registration against one step at a time, and
shapes held as rows against the same shapes made as tuples."""

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from latency import ForwardKey, build_latency_model
from latency.keys import StepShapes, shape_columns
from simulator import TokenBudget, Workload, plan, price
from simulator.shapebook import BULK_STEPS, ShapeBook, make_shape, signature
from tests.conftest import examples

QLEN = 2


class OneByOne:
    """An independent book: a dict from each step's full shape to its id, in order of first use."""

    def __init__(self):
        self.ids, self.shapes = {}, []

    def register(self, entries, d, ctx) -> int:
        shape = make_shape(entries, d, QLEN, ctx)
        if shape not in self.ids:
            self.ids[shape] = len(self.shapes)
            self.shapes.append(shape)
        return self.ids[shape]


# small values, so that steps repeat each other and the shapes registered before
_value = st.integers(1, 3)
# (requests, tokens, seq, decodes, context, mixed); no decodes, no context (as the planner keys them)
_step = st.tuples(st.sampled_from([1, 1, 2]), _value, _value, st.integers(0, 2), _value, st.booleans()).map(
    lambda step: step if step[3] else (*step[:4], 0, step[5]))
_call = st.one_of(st.tuples(st.just("one"), _step),
                  st.tuples(st.just("chunks"), st.lists(_step, min_size=1, max_size=5)),
                  st.tuples(st.just("chunks"), st.lists(_step, min_size=BULK_STEPS + 5, max_size=BULK_STEPS + 40)),
                  st.tuples(st.just("decodes"), st.lists(st.tuples(_value, _value), min_size=1, max_size=5)),
                  st.tuples(st.just("shape"), st.integers(0, 1000)))


def _entries(step):
    """A step's prefill entries: one chunk of `n` requests, or (`mixed`) that chunk and a whole prompt."""
    n, tok, seq, _, _, mixed = step
    return tuple(sorted((((tok, seq), n), ((9, 9), 2)))) if mixed else (((tok, seq), n),)


@settings(max_examples=examples(300), deadline=None)
@given(calls=st.lists(_call, min_size=1, max_size=8))
def test_a_bulk_registration_is_one_step_at_a_time(calls):
    """Whatever mix of single steps, bulk chunk steps (above and below BULK_STEPS, with steps of other
    forms among them), decode steps and shapes asked for on the way (as a round asks), the book gives
    every step the id and the shape that registering its full shape one at a time gives, and its
    table holds exactly those shapes, as tuples and as the columns a latency model prices."""
    book, reference = ShapeBook(QLEN), OneByOne()
    ids, expected = [], []
    for kind, arg in calls:
        if kind == "one":
            n, tok, seq, d, ctx, _ = arg
            ids.append(book.one(_entries(arg), d, ctx))
            expected.append(reference.register(_entries(arg), d, ctx))
        elif kind == "shape":
            if len(book):
                assert book.shape(arg % len(book)) == reference.shapes[arg % len(book)]
        elif kind == "decodes":
            ids += book.decodes([d for d, _ in arg], [ctx for _, ctx in arg])
            expected += [reference.register((), d, ctx) for d, ctx in arg]
        else:
            n, tok, seq, d, ctx, mixed = (list(col) for col in zip(*arg, strict=True))
            others = {j: _entries(step) for j, step in enumerate(arg) if step[5]}
            ids += book.chunks(np.array(tok), np.array(n), seq, np.array(d), np.array(ctx), others)
            expected += [reference.register(_entries(step), step[3], step[4]) for step in arg]
    assert ids == expected
    columns_first, tuples_first = book.table(), book.table()
    assert list(tuples_first) == reference.shapes
    for table in (columns_first, tuples_first):
        for mine, theirs in zip(table.entry_columns(), shape_columns(reference.shapes), strict=True):
            assert np.array_equal(mine, theirs)
    assert list(columns_first) == reference.shapes
    assert [book.shape(i) for i in range(len(book))] == reference.shapes


def test_a_bulk_of_chunks_holds_its_new_shapes_as_rows():
    """Chunk steps registered in bulk are not made: the table holds them as rows, makes them when
    asked, and gives the columns a latency model prices from without making them."""
    book = ShapeBook(QLEN)
    k = BULK_STEPS
    seqs = np.arange(1, k + 1) * 100
    ids = book.chunks(100, 1, seqs, np.r_[np.zeros(k // 2, dtype=int), np.full(k - k // 2, 3)], np.full(k, 640))
    assert ids == list(range(k)) and book.made == [None] * k
    table = book.table()
    assert "_tuples" not in table.__dict__
    step, dec, conc, q, s = table.entry_columns()
    assert "_tuples" not in table.__dict__
    assert table[0] == (ForwardKey(False, 1, 100, 100),)
    assert table[k - 1] == (ForwardKey(False, 1, 100, 100 * k), ForwardKey(True, 3, QLEN, 640))
    # the same columns as the tuples'
    for mine, theirs in zip((step, dec, conc, q, s), shape_columns(list(table)), strict=True):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)


def test_shapes_survive_pickling_and_price_alike_from_rows_or_tuples():
    """A plan's shapes (thousands held as rows: a 128k-token prompt in 2048-token chunks) pickle, and
    the roofline prices them from their columns exactly as from the same shapes made as tuples."""
    p = plan(Workload(128000, 64, 2048, 6), TokenBudget())
    shapes = p.shapes
    assert len(shapes._rows) > len(shapes) // 2  # most are held as rows
    again = pickle.loads(pickle.dumps(shapes))
    assert isinstance(again, StepShapes) and len(again) == len(shapes)
    lm = build_latency_model("Qwen/Qwen3-32B", "H200_SXM")
    from_rows = price(lm, p.price_keys, fused=True)
    assert "_tuples" not in shapes.__dict__  # priced without making the held rows
    assert np.array_equal(from_rows, lm.step_latency_ms(list(shapes)))
    assert list(again) == list(shapes)


def test_the_flat_signature_is_one_request_s_chunk_only():
    """One request's chunk is registered under (tokens, seq, decodes, context); anything else keeps its
    entries, so a chunk of two requests never meets one of one."""
    assert signature((((5, 10), 1),), 3, 128) == (5, 10, 3, 128)
    assert signature((((5, 10), 2),), 3, 128) == ((((5, 10), 2),), 3, 128)
    assert signature((), 3, 128) == ((), 3, 128)
    book = ShapeBook(1)
    assert book.one((((5, 10), 1),), 3, 128) != book.one((((5, 10), 2),), 3, 128)
