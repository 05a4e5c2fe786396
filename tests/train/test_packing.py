"""Packed training: packing and padding, targets that never cross documents, a packed forward
identical to running each document alone, equal losses and gradients packed and padded."""

import pytest
import torch

from flashlab import assert_close
from flashlab.train.model import CausalTransformer
from flashlab.train.packing import (
    IGNORE_INDEX,
    RepeatedPatternDocuments,
    pack,
    packed_forward,
    packed_loss,
    packed_targets,
    pad,
    padded_loss,
    training_throughput,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-5 if DEVICE == "cpu" else 3e-3      # the GPU's float32 attention runs its products in TF32


def _model(n_layers=2, **kwargs):
    return CausalTransformer(vocab_size=16, max_len=32, d_model=32, n_layers=n_layers, n_heads=2, **kwargs)


def _docs(lengths):
    return [torch.randint(0, 16, (n,)) for n in lengths]


def test_pack_pad_and_targets():
    docs = [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])]
    tokens, cu, max_len = pack(docs)
    assert tokens.tolist() == [1, 2, 3, 4, 5, 6] and cu.tolist() == [0, 3, 4, 6] and max_len == 3
    assert cu.dtype == torch.int32
    assert packed_targets(tokens, cu).tolist() == [2, 3, IGNORE_INDEX, IGNORE_INDEX, 6, IGNORE_INDEX]
    padded, lengths = pad(docs)
    assert padded.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]] and lengths.tolist() == [3, 1, 2]


def test_documents_have_random_lengths_with_the_asked_mean():
    task = RepeatedPatternDocuments(max_len=256, mean_fraction=0.25)
    docs = task.documents(2000, torch.Generator().manual_seed(0))
    lengths = torch.tensor([len(d) for d in docs], dtype=torch.float64)
    assert lengths.min() >= 1 and lengths.max() == 256
    assert abs(lengths.mean().item() / 256 - 0.25) < 0.02
    d = docs[0]
    period = next(p for p in range(2, 9) if len(d) <= p or torch.equal(d[p:], d[:-p]))
    assert period <= 8, "a document repeats its pattern"
    with pytest.raises(ValueError, match="mean_fraction"):
        RepeatedPatternDocuments(max_len=64, mean_fraction=0)


def test_packed_forward_equals_each_document_alone():
    model = _model().eval().to(DEVICE)
    docs = [d.to(DEVICE) for d in _docs([1, 7, 20, 3])]
    tokens, cu, max_len = pack(docs)
    cu = cu.to(DEVICE)
    with torch.no_grad():
        packed = packed_forward(model, tokens, cu, max_len)
        for doc, start in zip(docs, cu.tolist()):
            alone = model(doc[None])[0]
            assert_close(packed[start:start + len(doc)], alone, tol=TOL)


def test_packed_and_padded_losses_and_gradients_agree():
    model = _model().to(DEVICE)
    docs = _docs([9, 2, 17])
    loss_packed, slots_packed = packed_loss(model, docs, DEVICE)
    grads_packed = torch.autograd.grad(loss_packed, list(model.parameters()))
    loss_padded, slots_padded = padded_loss(model, docs, DEVICE)
    grads_padded = torch.autograd.grad(loss_padded, list(model.parameters()), allow_unused=True)
    assert slots_packed == 28 and slots_padded == 3 * 17
    assert_close(loss_packed, loss_padded, tol=TOL, what="loss")
    for g_packed, g_padded in zip(grads_packed, grads_padded):
        if g_padded is not None:
            assert_close(g_packed, g_padded, tol=10 * TOL, what="gradient")


def test_training_throughput_counts_real_tokens():
    model = _model(n_layers=1).to(DEVICE)
    batches = [_docs([3, 5]), _docs([4, 1, 2])]
    result = training_throughput(model, batches, packed=False, device=DEVICE, warmup=1)
    assert result["real_tokens"] == 7 and result["token_slots"] == 3 * 4 and result["tokens_per_s"] > 0
    result = training_throughput(model, batches, packed=True, device=DEVICE, warmup=1)
    assert result["real_tokens"] == 7 and result["token_slots"] == 7


def test_rotary_models_are_refused():
    model = _model(positions="rotary")
    tokens, cu, max_len = pack(_docs([3]))
    with pytest.raises(ValueError, match="learned"):
        packed_forward(model, tokens, cu, max_len)


def test_inputs_packed_forward_cannot_honour_are_refused():
    """A practitioner's trial: a training model with attention dropout ran packed without it
    (varlen_attention has no dropout), silently; tokens that do not match cu_seqlens failed deep in
    torch ("allocated size does not match")."""
    tokens, cu, max_len = pack(_docs([3, 5]))
    with pytest.raises(ValueError, match="^model: attention dropout is on"):
        packed_forward(_model(dropout=0.5).train(), tokens, cu, max_len)
    packed_forward(_model(dropout=0.5).eval(), tokens, cu, max_len)          # eval: no dropout to lose
    packed_forward(_model(dropout=0.5).train(), tokens, cu, max_len, varlen=False)   # SDPA's dropout
    with pytest.raises(ValueError, match="^cu_seqlens: ends at 8 but tokens holds 7"):
        packed_forward(_model(), tokens[:7], cu, max_len)


def test_offsets_from_lengths_refuse_what_is_not_a_list_of_lengths():
    from flashlab.api.varlen import cu_seqlens_from_lengths
    assert cu_seqlens_from_lengths([3, 0, 2]).tolist() == [0, 3, 3, 5]
    assert cu_seqlens_from_lengths(torch.tensor([4, 1])).tolist() == [0, 4, 5]
    assert cu_seqlens_from_lengths([]).tolist() == [0]
    for bad, message in (([3, -1, 2], "^lengths: entry 1 is -1"), ([1.7, 2.2], "^lengths: expected a 1-D"),
                         ([[1, 2], [3, 4]], "^lengths: expected a 1-D")):
        with pytest.raises(ValueError, match=message):
            cu_seqlens_from_lengths(bad)


@pytest.mark.parametrize("make", [pack, pad])
def test_what_is_not_a_list_of_documents_is_refused_in_one_line(make):
    """An empty list failed in torch.cat ("expected a non-empty list of Tensors") or in max(); a 2-D
    batch of rows was concatenated as if it were one document's tokens."""
    for bad, message in (([], "^documents: expected a non-empty list of 1-D token tensors, got an empty list$"),
                         (torch.zeros(2, 3, dtype=torch.long), "got a tensor; pass list"),
                         ([torch.tensor([1, 2]), torch.zeros(2, 2, dtype=torch.long)], "^documents: entry 1 is shape"),
                         ([torch.tensor([1, 2]), [3]], "^documents: entry 1 is list"),
                         ([torch.tensor([1]), torch.tensor([1], dtype=torch.int32)],
                          "^documents: entry 1 is torch.int32")):
        with pytest.raises(ValueError, match=message):
            make(bad)
    make(list(torch.zeros(2, 3, dtype=torch.long)))       # the fix the message names works
