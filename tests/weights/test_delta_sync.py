"""Delta weight syncs (rlharness/weights/delta.py): what a receiver holds after differences is bit for
bit what a full sync of the same version leaves, whatever changed, and a difference is never larger
than the tensor it replaces."""

from __future__ import annotations

import pytest
import torch

from rlharness.weights.delta import (BLOCKS, VALUES, DeltaEncoder, WeightShadow, apply_payload_, changed_blocks,
                                     check_payload, payload_names)
from rlharness.weights.transfer import state_bytes, weight_checksums


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(1000, 24, generator=g) * 0.05,
            "layer.q.weight": torch.randn(24, 24, generator=g) * 0.05,
            "layer.norm.weight": torch.ones(24),
            "odd": torch.randn(37, generator=g),  # not a multiple of any block size
            "scalar": torch.tensor(0.5)}


def _step(state: dict[str, torch.Tensor], lr: float, seed: int) -> dict[str, torch.Tensor]:
    """An optimizer-like update in float32: small steps, most below bfloat16's resolution."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + lr * torch.randn(v.shape, generator=g) for k, v in state.items()}


def _engine(dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """An engine's parameters as loaded from the initial model file (cast to its dtype)."""
    return {k: v.to(dtype) for k, v in _model().items()}


@pytest.mark.parametrize("block", [1, 16, 1024])
def test_differences_leave_the_engine_bit_identical_to_full_syncs(block):
    trainer = _model()
    encoder = DeltaEncoder("bfloat16", delta=True, block=block)
    by_delta, by_full = _engine(), _engine()
    sizes = []
    for version in range(1, 7):
        trainer = _step(trainer, lr=1e-4 if version < 5 else 0.0, seed=version)
        payload = encoder.encode(trainer)
        apply_payload_(by_delta, payload)
        encoder.commit(version)
        apply_payload_(by_full, trainer)  # a full sync: float32 copied into bfloat16 parameters
        expected = weight_checksums(by_full)
        assert all(torch.equal(s, expected[k]) for k, s in weight_checksums(by_delta).items()), version
        sizes.append(state_bytes(payload))
    full_bytes = sum(t.numel() * 2 for t in trainer.values())
    assert sizes[0] == full_bytes  # the first sync has no base: every tensor whole, in bfloat16
    assert max(sizes[1:5]) < full_bytes
    assert sizes[5] == 0  # nothing changed: nothing sent


def test_a_difference_names_only_changed_blocks_and_is_never_larger_than_the_tensor():
    encoder = DeltaEncoder("bfloat16", delta=True)
    state = _model()
    encoder.encode(state)
    encoder.commit(1)
    changed = {k: v.clone() for k, v in state.items()}
    changed["embed.weight"][3, 5] += 1.0  # one value of one tensor
    changed["layer.q.weight"] += 1.0  # every value: a difference would be larger than the tensor
    payload = encoder.encode(changed)
    assert sorted(payload) == ["embed.weight" + BLOCKS, "embed.weight" + VALUES, "layer.q.weight"]
    assert payload["embed.weight" + BLOCKS].tolist() == [3 * 24 + 5]
    assert payload["embed.weight" + BLOCKS].dtype == torch.int32
    assert payload["layer.q.weight"].dtype == torch.bfloat16
    assert payload_names(payload) == ["embed.weight", "layer.q.weight"]


def test_every_changed_bit_counts_nan_and_negative_zero_included():
    encoder = DeltaEncoder(None, delta=True)
    base = {"w": torch.zeros(2048)}
    encoder.encode(base)
    encoder.commit(1)
    changed = base["w"].clone()
    changed[7], changed[2000] = -0.0, float("nan")  # -0.0 == 0.0 as numbers; the bits differ
    payload = encoder.encode({"w": changed})
    assert payload["w" + BLOCKS].tolist() == [7, 2000]
    held = {"w": torch.zeros(2048)}
    apply_payload_(held, payload)
    assert torch.equal(held["w"].view(torch.int32), changed.view(torch.int32))


def test_a_full_encode_and_an_uncommitted_payload_never_move_the_base():
    encoder = DeltaEncoder("bfloat16", delta=True)
    v1 = _model()
    encoder.encode(v1)
    encoder.commit(1)
    v2 = _step(v1, 1e-2, seed=2)
    encoder.encode(v2)  # made, never delivered (a failed sync): not committed
    v3 = _step(v2, 1e-2, seed=3)
    payload = encoder.encode(v3)  # the difference to version 1, what the engines hold
    engine = {k: v.to(torch.bfloat16) for k, v in v1.items()}
    apply_payload_(engine, payload)
    assert all(torch.equal(engine[k], v3[k].to(torch.bfloat16)) for k in v3)
    assert set(encoder.encode(v3, full=True)) == set(v3)  # full: every tensor whole


def test_version_state_rebuilds_the_committed_version_or_the_one_in_flight():
    encoder = DeltaEncoder("bfloat16", delta=True)
    v1, v2 = _model(), _step(_model(), 1e-2, seed=1)
    encoder.encode(v1)
    encoder.commit(1)
    encoder.encode(v2)  # version 2 in flight (or put after its step, before its sync)
    for version, state in ((1, v1), (2, v2)):
        whole = encoder.version_state(version)
        assert set(whole) == set(state)
        assert all(torch.equal(whole[k], state[k].to(torch.bfloat16)) for k in state)
    with pytest.raises(ValueError, match="version 0 is older"):
        encoder.version_state(0)


def test_without_deltas_a_sync_is_the_cast_and_other_states_pass():
    encoder = DeltaEncoder("bfloat16", delta=False)
    state = _model()
    payload = encoder.encode(state)
    assert set(payload) == set(state) and all(t.dtype == torch.bfloat16 for t in payload.values())
    assert DeltaEncoder(None, delta=False).encode(state)["odd"].data_ptr() == state["odd"].data_ptr()  # no copy
    assert DeltaEncoder("bfloat16", delta=True).encode({"version": 3}) == {"version": 3}  # the sim backend's


def test_a_shadow_assembles_differences_from_reused_buffers_in_any_order():
    """A vLLM worker receives bucket by bucket into buffers it reuses: indices and values of one tensor
    come in different buckets (one dtype per bucket), each a view valid only while it is handed over."""
    encoder = DeltaEncoder("bfloat16", delta=True)
    shadow = WeightShadow()
    trainer = _model()
    for version in range(1, 4):
        trainer = _step(trainer, 1e-4, seed=version)
        payload = encoder.encode(trainer)
        encoder.commit(version)
        entries = sorted(payload.items(), key=lambda kv: kv[0].endswith(BLOCKS))  # values before their indices
        scratch = torch.empty(0)

        def reused(items):
            nonlocal scratch
            for key, value in items:
                scratch = value.clone()
                yield key, scratch
                scratch.fill_(7)  # the buffer is overwritten once the receiver moves on

        shadow.receive(reused(entries))
        assert set(shadow.tensors) == set(trainer)
        assert all(torch.equal(shadow.tensors[k], trainer[k].to(torch.bfloat16)) for k in trainer), version


def test_a_shadow_refuses_a_difference_for_what_it_never_held():
    encoder = DeltaEncoder("bfloat16", delta=True)
    encoder.encode(_model())
    encoder.commit(1)
    payload = encoder.encode(_step(_model(), 1e-4, seed=1))
    assert any(k.endswith(BLOCKS) for k in payload)
    with pytest.raises(ValueError, match="never held it whole.*full sync"):
        WeightShadow().receive(payload.items())


def test_check_payload_names_what_does_not_fit():
    shapes = {k: tuple(v.shape) for k, v in _model().items()}
    with pytest.raises(KeyError, match="not in the engine's model"):
        check_payload({"nope": torch.zeros(1)}, shapes)
    with pytest.raises(ValueError, match="shape mismatch"):
        check_payload({"odd": torch.zeros(36)}, shapes)
    with pytest.raises(ValueError, match="difference for odd"):
        check_payload({"odd" + BLOCKS: torch.tensor([37], dtype=torch.int32), "odd" + VALUES: torch.zeros(1)}, shapes)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset, numel", [(0, 4096), (0, 4093), (1, 4096), (3, 4092)])
def test_changed_elements_are_found_word_by_word_as_element_by_element(dtype, offset, numel):
    """The 8-byte word pass finds every changed element (each lane of a word, the sign bit included), in
    order; a tensor whose length or storage does not fit whole words gets the element pass."""
    g = torch.Generator().manual_seed(numel + offset)
    old = torch.randn(offset + numel, generator=g).to(dtype)[offset:]
    new = old.clone()
    where = torch.randperm(numel, generator=g)[:50]
    new[where] = -new[where]  # a sign bit: the top bit of its lane
    new[:4] = torch.tensor([1.0, -2.0, 3.0, -4.0]).to(dtype)  # every lane of the first word
    want = (old.view(BITS[dtype]) != new.view(BITS[dtype])).nonzero().flatten()
    got = changed_blocks(old, new, 1)
    assert got.dtype == torch.int32 and torch.equal(got.long(), want)
    assert changed_blocks(old, new, 1, most=int(want.numel()) - 1) is None
    assert changed_blocks(old, new, 1, most=int(want.numel())) is not None


BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
