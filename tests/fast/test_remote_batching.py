"""The batching helpers of the remote-code drivers (verbmirage.models.remote_driver): pure functions."""

from __future__ import annotations

import torch

from verbmirage.models.remote_driver import (
    FORWARD_COST,
    by_key,
    common_prefix,
    expand_cache,
    length_batches,
    pad_rows,
    trim_after_end,
)


def test_the_shared_prefix_and_the_groups_by_image():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix([[7, 8], [7, 8]]) == 2
    assert by_key(["b", "a", "b", "c", "a"]) == [("b", [0, 2]), ("a", [1, 4]), ("c", [3])]


def test_rows_are_padded_on_the_side_asked_with_their_mask_and_lengths():
    ids, mask, lengths = pad_rows([[5, 6, 7], [8]], 0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert lengths.tolist() == [3, 1]
    ids, mask, _ = pad_rows([[5, 6, 7], [8]], -1, left=True)
    assert ids.tolist() == [[5, 6, 7], [-1, -1, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_a_batch_row_ends_at_its_first_end_token():
    assert trim_after_end([4, 9, 2, 2, 2], {2}) == [4, 9, 2]
    assert trim_after_end([4, 9], {2}) == [4, 9]


def test_a_batch_one_cache_is_seen_as_many_rows_without_a_copy():
    past = ((torch.arange(6.0).reshape(1, 3, 2), torch.zeros(1, 3, 2)),)
    wide = expand_cache(past, 4)
    assert wide[0][0].shape == (4, 3, 2) and wide[0][0].data_ptr() == past[0][0].data_ptr()
    assert torch.equal(wide[0][0][3], past[0][0][0])


def test_suffixes_are_cut_by_length_where_padding_costs_more_than_a_forward():
    lengths = [30, 100, 32, 101, 31, 99]
    batches = length_batches(lengths, None)
    assert batches == [[0, 4, 2], [5, 1, 3]]  # 3 x 32 + 3 x 101 + 2 forwards < 6 x 101 + 1 forward
    assert sorted(i for batch in batches for i in batch) == list(range(6))
    assert length_batches([10, 12, 11], None) == [[0, 2, 1]]  # padding 2 positions: one forward
    assert all(len(batch) <= 2 for batch in length_batches(lengths, 2))
    assert sorted(map(len, length_batches([5] * 5, 2))) == [1, 2, 2]
    assert FORWARD_COST > 0
