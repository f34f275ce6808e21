"""Decodings as strategy objects (variants/strategies.py, vcd.py, opera.py, registry.py) and the shared rule
that turns first-position numbers into result rows (models/answers.py).

The strategies run here on toy steppers handed to them as the engine would (the ``DecodingRows`` protocol):
no model is loaded. Their results on the real engine are the decoding oracles of ``test_decoding_variants.py``
and ``test_opera.py``.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from verbmirage.variants import search, vcd
from verbmirage.variants.settings import Variant, question_seed

VOCAB = 9


class TableStepper:
    """Next-token logits from a fixed table by the last fed token; records what it was fed."""

    def __init__(self, rows: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(VOCAB, VOCAB, generator=generator) * 3
        self.first = self.table[0].repeat(rows, 1)
        self.fed: list[list[int]] = []

    def advance(self, tokens):
        self.fed.append(tokens.tolist())
        return self.table[tokens]

    def reorder(self, rows):
        pass


class Rows:
    """What the engine hands a strategy: rows that open streams (clean, and noised for VCD)."""

    def __init__(self, question_ids, streams: dict):
        self.name, self.question_ids, self.streams, self.opened = "toy", question_ids, streams, []

    def open(self, repeats, fresh=False):
        self.opened.append(repeats)

        def stream(noised):
            stepper = self.streams[noised](len(self.question_ids) * repeats)
            return stepper.first, stepper

        return self.strategy.combine(stream)


def _rows(strategy, n=2):
    rows = Rows([f"q{i}" for i in range(n)], {False: lambda r: TableStepper(r, 0), True: lambda r: TableStepper(r, 1)})
    rows.strategy = strategy
    return rows


@pytest.mark.parametrize("entry, kind, beams, streams, attention, spans_calls, joins, first_decides", [
    ({}, "Greedy", 1, 1, False, True, True, True),
    ({"decoding": "beam"}, "BeamSearch", 5, 1, False, False, True, False),
    ({"decoding": "sample"}, "Sampling", 1, 1, False, False, True, False),
    ({"decoding": "opera"}, "Opera", 5, 1, True, False, False, False),
    ({"vcd": {}}, "ContrastiveDecoding", 1, 2, False, True, True, True),
    ({"decoding": "beam", "num_beams": 3, "vcd": {}}, "ContrastiveDecoding", 3, 2, False, False, True, False),
])
def test_each_strategy_declares_what_it_needs_from_the_engine(entry, kind, beams, streams, attention, spans_calls,
                                                               joins, first_decides):
    strategy = Variant.from_config(entry).strategy()
    assert type(strategy).__name__ == kind
    assert (strategy.beams, strategy.streams, strategy.needs_last_attention, strategy.call_spans_batches,
            strategy.joins_rows, strategy.decides_by_first_token) == (beams, streams, attention, spans_calls, joins,
                                                                      first_decides)


def test_openings_are_kept_where_a_decoding_follows_on_the_scoring_rows():
    """Greedy keeps the undecided rows when it continues them; greedy VCD never (its first token is the
    contrast's argmax, not the clean scoring argmax the rows were kept by); the others always."""
    keeps = lambda entry, tokens: Variant.from_config(entry).strategy().keeps_openings(tokens)  # noqa: E731
    assert keeps({}, 8) and not keeps({}, 0)
    assert not keeps({"vcd": {}}, 8)
    assert keeps({"decoding": "beam", "vcd": {}}, 0) and keeps({"decoding": "sample"}, 0) and keeps({"decoding": "opera"}, 0)


@pytest.mark.parametrize("entry", [{}, {"decoding": "beam", "num_beams": 3}, {"decoding": "sample", "seed": 4}])
def test_strategies_decode_the_rows_the_engine_hands_them_with_the_search_loops(entry):
    variant = Variant.from_config({**entry, "max_new_tokens": 4})
    strategy = variant.strategy()
    rows = _rows(strategy)
    got = strategy.decode(rows, 4, {8})
    assert rows.opened == [strategy.beams]  # one opening, each row repeated per beam
    stepper = TableStepper(2 * strategy.beams, 0)
    if entry.get("decoding") == "beam":
        expected = search.beam_search(stepper.first, stepper, 3, 4, {8}, variant.length_penalty)
    elif entry.get("decoding") == "sample":
        seeds = [question_seed(question_id, 4) for question_id in rows.question_ids]
        expected = search.sample_search(stepper.first, stepper, 4, {8}, seeds, 1.0, 0, 1.0)
    else:
        expected = search.greedy_search(stepper.first, stepper, 4, {8})
    assert got == expected


def test_vcd_decodes_its_inner_search_on_the_contrast_of_two_streams():
    variant = Variant.from_config({"decoding": "beam", "num_beams": 2, "vcd": {"alpha": 0.5}})
    strategy = variant.strategy()
    rows = _rows(strategy)
    got = strategy.decode(rows, 3, {8})
    clean, noised = TableStepper(4, 0), TableStepper(4, 1)
    first = vcd.contrast(clean.first, noised.first, variant.vcd)
    expected = search.beam_search(first, vcd.ContrastedStepper(clean, noised, variant.vcd, 4), 2, 3, {8})
    assert got == expected

    contrasted, columns = strategy.contrast_first(clean.first[:2], noised.first[:2])
    assert torch.equal(contrasted, first[:2])
    assert set(columns[0]) == {"vcd_kl", "vcd_kl_reverse", "vcd_plausible"} and columns[0]["vcd_kl"] >= 0


class Attending(Rows):
    """Rows for OPERA (the ``AttendingRows`` protocol): one image span, 10-token prompts; ``children``: the
    batches of one question that :meth:`alone` handed out."""

    @classmethod
    def of(cls, strategy, question_ids, streams: dict) -> "Attending":
        rows = cls(question_ids, streams)
        rows.strategy, rows.children = strategy, []
        return rows

    def image_spans(self):
        return [(1, 4)] * len(self.question_ids)

    def prompt_lengths(self):
        return [10] * len(self.question_ids)

    def attending(self, first, stepper):
        stepper.first = first
        return stepper

    def alone(self, row):
        one = type(self).of(self.strategy, [self.question_ids[row]], self.streams)
        self.children.append(one)
        return one


def test_opera_decodes_a_batch_whose_images_sit_apart_one_question_at_a_time(monkeypatch):
    """OPERA's batch needs one image span: with two, each question decodes alone (opera_search), on rows
    opened apart from the call's tokenization (``fresh``)."""
    strategy = Variant.from_config({"decoding": "opera", "num_beams": 2}).strategy()
    alone, columns = [], []

    def opera_search(first, stepper, opera, beams, new_tokens, stop, span, prompt_columns, *args, **kwargs):
        alone.append(first.shape[0])
        columns.append(prompt_columns)
        return search.Decoded([[1, 2]], [0.5]), []

    monkeypatch.setattr(search, "opera_search", opera_search)

    class Apart(Attending):
        def image_spans(self):
            return [(1, 4), (2, 5)][: len(self.question_ids)] if len(self.question_ids) > 1 else [(1, 4)]

        def attending(self, first, stepper):
            # the second question's row was kept from a wider scoring batch: its decoded keys start at 14,
            # past its 10 prompt tokens; the first was opened alone (the stepper does not say)
            stepper.first, stepper.prompt_columns = first, 14 if self.question_ids == ["b"] else None
            return stepper

    rows = Apart.of(strategy, ["a", "b"], {False: lambda r: TableStepper(r, 0)})
    assert strategy.decode(rows, 3, {8}) == search.Decoded([[1, 2], [1, 2]], [0.5, 0.5])
    assert alone == [2, 2] and rows.opened == [] and [child.opened for child in rows.children] == [[2], [2]]
    assert columns == [10, 14]  # where each row's decoded keys start: its prompt's end, or its stepper's word


def test_opera_decodes_a_batch_whose_decoded_keys_start_at_different_columns_one_question_at_a_time(monkeypatch):
    """Rows whose decoded tokens' keys start at different columns of the attention rows (the engine's stepper
    says ``prompt_columns`` None: rows joined over prefixes of different lengths) cannot share OPERA's window:
    the batch's opened rows go unused and each question decodes alone, on rows opened for it."""
    strategy = Variant.from_config({"decoding": "opera", "num_beams": 2}).strategy()
    batched, alone = [], []
    monkeypatch.setattr(search, "opera_batch", lambda first, *args, **kwargs: batched.append(first.shape[0]))
    monkeypatch.setattr(search, "opera_search", lambda first, *args, **kwargs: (
        alone.append(first.shape[0]), (search.Decoded([[1, 2]], [0.5]), []))[1])

    def opened(rows: int) -> TableStepper:
        stepper = TableStepper(rows, 0)
        stepper.prompt_columns = 12 if rows == 2 else None  # a question alone: its prompt's end
        return stepper

    rows = Attending.of(strategy, ["a", "b"], {False: opened})
    assert strategy.decode(rows, 3, {8}) == search.Decoded([[1, 2], [1, 2]], [0.5, 0.5])
    assert batched == [] and alone == [2, 2]
    assert rows.opened == [2] and [child.opened for child in rows.children] == [[2], [2]]


def test_the_variants_layer_imports_nothing_of_the_models():
    """Strategies talk to the engine through protocols: importing them (and the registry) loads no model code."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys\nimport verbmirage.variants.strategies, verbmirage.variants.vcd, "
         "verbmirage.variants.opera, verbmirage.variants.registry\n"
         "print(sorted(m for m in sys.modules if m.startswith('verbmirage.models')))"],
        capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


# ---- the answer rule both the engine and the remote-code adapters use ----------------------------------------
def test_p_yes_is_the_ratio_in_the_dtype_the_backend_computed_its_mass_in():
    from verbmirage.models.answers import yes_no_results

    yes, no = np.array([0.7, 0.0], dtype=np.float32), np.array([0.2, 0.0], dtype=np.float32)
    texts = [("Yes", None), ("maybe", "")]
    rows = yes_no_results(yes, no, [1.25, math.inf], [0.6, 0.0], [0.7, 0.1], texts, [None, None], "greedy")
    assert rows[0].p_yes == float(yes[0] / (yes[0] + no[0])) != 0.7 / (0.7 + 0.2)  # float32 arithmetic
    assert (rows[0].prediction, rows[0].yes_margin, rows[0].yes_mass) == ("yes", 1.25, 0.6)
    assert math.isnan(rows[1].p_yes) and rows[1].yes_margin is None and rows[1].prediction == "unknown"
    wide = yes_no_results(np.array([0.7, 0.0]), np.array([0.2, 0.0]), [1.0, 1.0], [0.6, 0.0], [0.7, 0.1],
                          texts, [None, "image x.png: broken"], "beam5", [{"vcd_kl": 0.5}, {}])
    assert wide[0].p_yes == 0.7 / (0.7 + 0.2) and wide[0].vcd_kl == 0.5 and wide[0].parse_rule.startswith("beam5:")
    assert wide[1].error == "image x.png: broken" and math.isnan(wide[1].p_yes)


def test_option_probabilities_are_renormalised_over_each_questions_own_options():
    from verbmirage.models.answers import choice_results

    rows = choice_results([[0.2, 0.6, 0.1, 0.05], [0.0, 0.0, 0.3]], [0.6, 0.3], [("B", None), ("C", None)],
                          [None, None], [("a", "b", "c"), ("a", "b")], "greedy")
    assert rows[0].option_probs == pytest.approx((0.2 / 0.9, 0.6 / 0.9, 0.1 / 0.9)) and rows[0].prediction == "B"
    assert all(math.isnan(p) for p in rows[1].option_probs) and len(rows[1].option_probs) == 2
    assert rows[1].prediction == "unknown"  # "C" is not an option of a two-option question


def test_batched_sampling_draws_what_a_multinomial_per_row_draws():
    """sample_search draws every row in one batched step: the tokens torch.multinomial draws from each row's own
    generator, row by row (the per-row loop it replaced)."""
    stepper = TableStepper(5, 3)
    seeds = [11, 12, 13, 14, 15]
    drawn = search.sample_search(stepper.first, stepper, 6, set(), seeds, temperature=0.7)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    logits, expected = stepper.first, []
    for _ in range(6):
        probabilities = torch.softmax(logits / 0.7, dim=-1)
        chosen = torch.stack([torch.multinomial(row, 1, generator=g)[0] for row, g in zip(probabilities, generators)])
        expected.append(chosen)
        logits = stepper.table[chosen]
    assert drawn.tokens == torch.stack(expected, dim=1).tolist()


def test_sampling_draws_before_it_reads_the_step_and_reads_back_only_its_tokens():
    """A sampling step draws its noise before any operation on the step's logits (on a GPU the host draws while
    the device computes the step), works on the logits where they are, and a row with no finite distribution
    is refused by name."""
    stepper = TableStepper(4, 2)
    order = []

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("exponential_", "_softmax", "softmax"):
                order.append(name)
            return func(*args, **(kwargs or {}))

    with Recorder():
        search.sample_search(stepper.first, stepper, 3, set(), [1, 2, 3, 4])
    steps = [order[i:i + 5] for i in range(0, len(order), 5)]
    assert len(steps) == 3 and all(step == ["exponential_"] * 4 + ["_softmax"] for step in steps), order
    masked = stepper.first.clone()
    masked[2] = -math.inf  # every token of row 2 masked: its probabilities are NaN
    with pytest.raises(ValueError, match="not finite"):
        search.sample_search(masked, stepper, 3, set(), [1, 2, 3, 4])


class RowTable:
    """A stepper over rows of different tables (row r reads ``tables[r]``): rows leave it with ``reorder``."""

    def __init__(self, tables: list[torch.Tensor]):
        self.tables, self.fed = list(tables), []
        self.first = torch.stack([table[0] for table in self.tables])

    def advance(self, tokens):
        self.fed.append(len(tokens))
        return torch.stack([table[token] for table, token in zip(self.tables, tokens.tolist())])

    def reorder(self, rows):
        self.tables = [self.tables[row] for row in rows.tolist()]


def _row_tables(rows: int, stop: int) -> list[torch.Tensor]:
    """Per row a table whose greedy answer reaches ``stop`` after about ``row`` tokens."""
    tables = []
    for row in range(rows):
        table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(row))
        for token in range(VOCAB):  # a chain 0 -> 1 -> 2 ... that ends in the stop token at step ``row``
            table[token, (token + 1) % VOCAB] += 20
        table[row % (VOCAB - 1), :] = 0.0
        table[row % (VOCAB - 1), stop] = 30
        tables.append(table)
    return tables


@pytest.mark.parametrize("decoding", ["greedy", "sample"])
def test_rows_that_ended_leave_the_step_and_the_rest_answer_as_alone(decoding):
    """A row whose answer reached a stop token is not fed again (later steps feed fewer rows); every row's answer
    and first probability equal its own decoding alone (sampling: its own generator's draws)."""
    stop, seeds = VOCAB - 1, [5, 6, 7, 8, 9]

    def decode(stepper, rows):
        if decoding == "greedy":
            return search.greedy_search(stepper.first, stepper, 7, {stop})
        return search.sample_search(stepper.first, stepper, 7, {stop}, [seeds[row] for row in rows], 0.3)

    tables = _row_tables(5, stop)
    stepper = RowTable(tables)
    together = decode(stepper, range(5))
    assert stepper.fed == sorted(stepper.fed, reverse=True) and stepper.fed[-1] < 5  # (it was 5 at every step)
    assert sum(len(tokens) < 6 for tokens in together.tokens) >= 2  # some ended early
    for row in range(5):
        alone = decode(RowTable([tables[row]]), [row])
        assert together.tokens[row] == alone.tokens[0]
        assert together.first_probability[row] == pytest.approx(alone.first_probability[0], abs=1e-7)


def test_beam_search_stops_feeding_questions_that_can_no_longer_improve():
    """Beam search's questions that can no longer improve leave the stepper (later steps feed only the others'
    beams), and every question's best hypothesis and first probability equal its own search alone."""
    stop, k = VOCAB - 1, 3
    tables = _row_tables(6, stop)
    stepper = RowTable([table for table in tables for _ in range(k)])
    together = search.beam_search(stepper.first, stepper, k, 7, {stop})
    assert stepper.fed[-1] < 6 * k  # some questions left early (every step fed all 18 rows before)
    assert all(fed % k == 0 for fed in stepper.fed) and stepper.fed == sorted(stepper.fed, reverse=True)
    for question, table in enumerate(tables):
        alone_stepper = RowTable([table] * k)
        alone = search.beam_search(alone_stepper.first, alone_stepper, k, 7, {stop})
        assert together.tokens[question] == alone.tokens[0]
        assert together.first_probability[question] == pytest.approx(alone.first_probability[0], abs=1e-7)


class AttendingRowTable(RowTable):
    """A :class:`RowTable` that also reports attention rows (OPERA's ``AttentionStepper``): a fed token (or a
    probed candidate) attends evenly to the keys before it and to itself by its token id; ``probed`` records the
    rows of each probe."""

    prompt_columns = 4

    def __init__(self, tables: list[torch.Tensor]):
        super().__init__(tables)
        self.keys, self.probed = self.prompt_columns, []

    def _rows(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = torch.ones(*tokens.shape, self.keys + 1)
        rows[..., -1] += tokens.float()
        return rows

    def advance(self, tokens):
        logits = super().advance(tokens)
        self.attention = self._rows(tokens[:, None])[:, 0]
        self.keys += 1
        return logits

    def probe(self, candidates):
        self.probed.append(len(candidates))
        return self._rows(candidates)


def test_opera_stops_probing_and_feeding_questions_whose_answers_ended():
    """OPERA's batch: a question whose answer ended (its result taken) leaves the stepper, so later steps probe
    and feed only the other questions' beams, and every question's answer and first probability equal its own
    OPERA alone."""
    stop, k = VOCAB - 1, 2
    settings = Variant.from_config({"decoding": "opera", "opera": {"num_attn_candidates": 3, "reward_tokens": 2}}).opera
    tables = [table / 4 for table in _row_tables(5, stop)]  # (first probabilities below 1)
    stepper = AttendingRowTable([table for table in tables for _ in range(k)])
    columns = AttendingRowTable.prompt_columns
    together = search.opera_batch(stepper.first, stepper, settings, k, 7, {stop}, (1, 2), columns, [columns] * 5)
    # the questions end at different steps: each step probes and feeds fewer rows (every step all 10 before)
    assert stepper.probed == [10, 10, 10, 10, 8, 2, 2] and stepper.fed == stepper.probed[1:]
    for question, table in enumerate(tables):
        alone_stepper = AttendingRowTable([table] * k)
        alone, _ = search.opera_search(alone_stepper.first, alone_stepper, settings, k, 7, {stop}, (1, 2), columns,
                                       lambda: None)
        assert together[question].tokens == alone.tokens
        assert together[question].first_probability == pytest.approx(alone.first_probability, abs=1e-7)


def test_vcd_streams_stepping_joined_drop_the_same_rows_from_both():
    """VCD's streams stepping in one forward (``stepped_with``): when rows end, the joined stepper keeps the same
    rows of the clean half and of the noised half, wherever the noised half starts by then."""
    stop = VOCAB - 1
    tables = _row_tables(4, stop)

    class Joinable(RowTable):
        def stepped_with(self, other):
            self.joined = RowTable(self.tables + other.tables)
            self.joined.kept = []
            taking = self.joined.reorder

            def reorder(rows):
                self.joined.kept.append(rows.tolist())
                taking(rows)
            self.joined.reorder = reorder
            return self.joined

    clean, noised = Joinable(tables), RowTable(tables)
    settings = Variant.from_config({"vcd": {"alpha": 0.5}}).vcd
    first = vcd.contrast(clean.first, noised.first, settings)
    stepper = vcd.ContrastedStepper(clean, noised, settings, rows=4)
    together = search.greedy_search(first, stepper, 7, {stop})
    assert clean.joined.kept  # rows left
    count = 4
    for kept in clean.joined.kept:
        half = len(kept) // 2
        assert kept[half:] == [row + count for row in kept[:half]] and max(kept[:half]) < count
        count = half
    for row in range(4):  # each as alone: its contrast of identical streams is its own table's
        alone_stepper = vcd.ContrastedStepper(RowTable([tables[row]]), RowTable([tables[row]]), settings, rows=1)
        alone = search.greedy_search(first[row : row + 1], alone_stepper, 7, {stop})
        assert together.tokens[row] == alone.tokens[0]


def test_greedy_takes_a_probability_on_its_first_step_only():
    """An answer keeps its first token's probability; later steps of a greedy continuation take the argmax
    alone: no softmax over the vocabulary (on a GPU: no second copy to the host per step), the same tokens."""
    stepper = TableStepper(3, 5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decoded = search.greedy_search(stepper.first, stepper, 6, set())
    assert sum(event.name == "aten::softmax" for event in prof.events()) == 1
    logits, expected = stepper.first, []
    for _ in range(6):
        expected.append(logits.argmax(-1))
        logits = stepper.table[expected[-1]]
    assert decoded.tokens == torch.stack(expected, dim=1).tolist()
    assert decoded.first_probability == torch.softmax(stepper.first, -1).max(-1).values.tolist()


def test_the_first_tokens_probabilities_are_read_in_one_gather_nan_where_none_was_chosen():
    from verbmirage.variants.search import _chosen_probability

    probabilities = torch.rand(4, 7)
    got = _chosen_probability(probabilities, [3, 0, 2, 1], [5, -1, 0, 6])
    assert got[1] != got[1]  # NaN: no token chosen
    assert [got[i] for i in (0, 2, 3)] == [probabilities[3, 5].item(), probabilities[2, 0].item(),
                                           probabilities[1, 6].item()]
    assert _chosen_probability(probabilities, [0], [-1])[0] != _chosen_probability(probabilities, [0], [-1])[0]


@pytest.mark.parametrize("left", [False, True])
def test_token_rows_pad_into_one_batch_on_either_side(left):
    from verbmirage.models.hf.tokens import padded

    rows = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])]
    ids, lengths = padded(rows, 0, "cpu", left=left)
    expected = [[5, 6, 7], [0, 0, 8], [0, 9, 10]] if left else [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert ids.tolist() == expected and ids.dtype == torch.long and lengths.tolist() == [3, 1, 2]
