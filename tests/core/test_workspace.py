"""The per-device pools: disjoint aligned scratch views, sized at prepare time, a clear error beyond them."""

import pytest
import torch

import b12x_core as bc
from b12x_core import workspace


def test_carve_gives_disjoint_aligned_views():
    device = torch.device("cpu")
    specs = [((3, 5), torch.bfloat16), ((7,), torch.float32), ((2, 2), torch.uint8)]
    workspace.reserve_scratch(device, workspace.nbytes(specs))
    views = workspace.carve(device, specs)
    assert [tuple(v.shape) for v in views] == [(3, 5), (7,), (2, 2)]
    assert [v.dtype for v in views] == [torch.bfloat16, torch.float32, torch.uint8]
    starts = [v.data_ptr() for v in views]
    assert all(a % 256 == starts[0] % 256 for a in starts)  # each starts on the 256-byte grid
    ends = [v.data_ptr() + v.numel() * v.element_size() for v in views]
    assert all(ends[i] <= starts[i + 1] for i in range(len(views) - 1))
    for value, v in enumerate(views):  # writing one leaves the others alone
        v.fill_(value + 1)
    assert [int(v.flatten()[0]) for v in views] == [1, 2, 3]


def test_a_call_beyond_the_reserved_size_says_so():
    device = torch.device("cpu")
    huge = [((1 << 40,), torch.uint8)]
    with pytest.raises(bc.UnsupportedError, match="exceeds the max_tokens its op was prepared for"):
        workspace.carve(device, huge)


def test_weight_workspace_views_and_limit():
    device = torch.device("cpu")
    workspace.reserve_weights(device, 6 * 7)
    w = workspace.weights(device, 6, 7)
    assert w.shape == (6, 7) and w.dtype == torch.bfloat16
    with pytest.raises(bc.UnsupportedError, match="smaller than"):
        workspace.weights(device, 1 << 20, 1 << 20)


def test_a_call_that_needs_no_temporaries_needs_no_pool():
    """A small layer of bf16 activations whose tensor-core configuration splits no K carves nothing; it must run
    on a device where nothing reserved scratch or tickets (prepare_linear's warm-up crashed there once). The meta
    device: only these tests touch its pools, and zero-sized carves must not look at them at all."""
    device = torch.device("meta")
    views = workspace.carve(device, [((0, 5), torch.bfloat16), ((0,), torch.float32)])
    assert [tuple(v.shape) for v in views] == [(0, 5), (0,)]
    assert workspace.carve(device, []) == []
    assert workspace.tickets(device, 0).numel() == 0
    with pytest.raises(bc.UnsupportedError, match="this call needs 1099511627776"):
        workspace.carve(device, [((1 << 40,), torch.uint8)])  # a call that needs more than any pool still says so


def test_pools_are_sized_once_per_device_and_grow():
    device = torch.device("meta")
    workspace.reserve_scratch(device, 1000)
    workspace.reserve_scratch(device, 10)  # a smaller op later keeps the larger size
    assert workspace.carve(device, [((1000,), torch.uint8)])[0].numel() == 1000
    workspace.reserve_scratch(device, 4000)
    assert workspace.carve(device, [((1000,), torch.float32)])[0].numel() == 1000
    workspace.reserve_tickets(device, 3)
    assert workspace.tickets(device, 3).shape == (3,)
