"""SampleBatch pickles its CPU tensors as numpy arrays (`to_wire` in `mindrl.data.batch`):
the same values, dtypes and shapes come back, writable, whatever the layout that was sent."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from mindrl.data.batch import SampleBatch, from_wire, to_wire


def _batch() -> SampleBatch:
    gen = torch.Generator().manual_seed(0)
    rows, cols = 6, 9
    return SampleBatch(
        input_ids=torch.randint(0, 500, (rows, cols), generator=gen),
        attention_mask=torch.ones(rows, cols, dtype=torch.long),
        response_mask=torch.randn(cols - 1, rows, generator=gen).t(),  # not contiguous
        prompt_lengths=torch.full((rows,), 3),
        response_lengths=torch.arange(rows),
        tensors={
            "advantages": torch.randn(rows, cols - 1, generator=gen, requires_grad=True),
            "ref_log_probs": torch.randn(rows, cols - 1, generator=gen).to(torch.bfloat16),
            "kept": torch.rand(rows, generator=gen) > 0.5,
            "complex": torch.randn(rows, 2, generator=gen, dtype=torch.complex64),
        },
        meta={"policy_version": list(range(rows)), "uid": [f"s{i}" for i in range(rows)]},
    )


def _fields(batch: SampleBatch) -> dict[str, torch.Tensor]:
    names = ("input_ids", "attention_mask", "response_mask", "prompt_lengths", "response_lengths")
    return {**{n: getattr(batch, n) for n in names}, **batch.tensors}


def test_a_batch_comes_back_equal_through_pickle():
    batch = _batch()
    back = pickle.loads(pickle.dumps(batch))
    assert back.meta == batch.meta
    sent, got = _fields(batch), _fields(back)
    assert sent.keys() == got.keys()
    for name, tensor in sent.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor.detach()), name
        assert not got[name].requires_grad


def test_cpu_tensors_travel_as_numpy_and_others_as_tensors():
    batch = _batch()
    _, (grids, tensors, _meta) = batch.__reduce__()
    assert all(isinstance(g[0], np.ndarray) for g in grids)
    assert isinstance(tensors["ref_log_probs"][0], np.ndarray)  # bfloat16 as its bits
    assert tensors["ref_log_probs"][1] is torch.bfloat16
    assert isinstance(tensors["complex"], torch.Tensor)  # no wire form: torch's own pickling


def test_a_read_only_array_arrives_as_a_writable_tensor():
    array, dtype = to_wire(torch.arange(4.0))
    array.flags.writeable = False
    tensor = from_wire((array, dtype))
    tensor.add_(1)
    assert tensor.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert array.tolist() == [0.0, 1.0, 2.0, 3.0]
