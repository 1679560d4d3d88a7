"""The weight group's pipelined transfer: bucket k+1 is on the wire while the receiver loads bucket k,
and what arrives is the sender's exact tensors (two processes, gloo, no Ray)."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch

from rlharness.weights.transfer import WeightGroupMember, plan_buckets, tensor_specs
from tests.helpers import HANG_S

pytestmark = pytest.mark.timeout(2 * HANG_S)  # waits below are bounded by HANG_S: only a hang reaches them

BUCKET_BYTES = 4096


def state(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"a": torch.randn(600, generator=g), "c": torch.randn(3, 250, generator=g)}  # 2400 + 3000 bytes


def fused_state(version: int) -> dict[str, torch.Tensor]:
    """A layer whose q/k/v (and gate/up) an engine fuses: with a 4096-byte cap they would straddle buckets."""
    g = torch.Generator().manual_seed(version)
    sizes = {"m.embed.weight": 700, "m.layers.0.attn.q.weight": 300, "m.layers.0.attn.k.weight": 300,
             "m.layers.0.attn.v.weight": 300, "m.layers.0.mlp.gate.weight": 300, "m.layers.0.mlp.up.weight": 300,
             "m.norm.weight": 700}
    return {name: torch.randn(n, generator=g) for name, n in sizes.items()}


def _sender(port: int, sent, errors, make_state=state) -> None:
    try:
        member = WeightGroupMember("gloo", "127.0.0.1", port, 0, 2, HANG_S, BUCKET_BYTES)
        for version in (1, 2):
            member.send(make_state(version), version)
            sent.set()  # every bucket of this version is through
        member.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        errors.put(f"sender: {exc!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_receive_stream_overlaps_loading_with_the_next_bucket():
    specs = tensor_specs(state(1))
    assert len(plan_buckets(specs, BUCKET_BYTES)) == 2
    ctx = mp.get_context("spawn")
    sent, errors = ctx.Event(), ctx.Queue()
    port = _free_port()
    proc = ctx.Process(target=_sender, args=(port, sent, errors), daemon=True)
    proc.start()
    try:
        receiver = WeightGroupMember("gloo", "127.0.0.1", port, 1, 2, HANG_S, BUCKET_BYTES)
        buckets = plan_buckets(specs, BUCKET_BYTES)
        first_bucket = {specs[i].name for i in buckets[0]}
        for version in (1, 2):
            sent.clear()
            got = {}
            for name, tensor in receiver.receive_stream(version, specs):
                if not got:
                    assert name in first_bucket
                    # Still holding bucket 0: bucket 1 (the last) must be able to arrive meanwhile, so
                    # the sender finishes. Without the pipeline it would wait for us, and we for it.
                    assert sent.wait(HANG_S), "the sender could not finish while bucket 0 was being loaded"
                got[name] = tensor.clone()
            want = state(version)
            assert list(got) == list(want)
            for name, t in want.items():
                assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
        receiver.close()
    finally:
        proc.join(HANG_S)
        assert errors.empty(), errors.get()
        assert proc.exitcode == 0


def test_a_fused_layer_arrives_in_one_bucket_for_a_loader_that_holds_its_parts():
    """vLLM's reload holds a fused layer's parts (views of the kept buffers) until its last part
    arrives. Were q in bucket 0 and k, v in bucket 1, bucket 2 would overwrite q (buffer 0 again)
    before the layer is loaded: the planner keeps such a group in one bucket."""
    specs = tensor_specs(fused_state(1))
    ctx = mp.get_context("spawn")
    sent, errors = ctx.Event(), ctx.Queue()
    port = _free_port()
    proc = ctx.Process(target=_sender, args=(port, sent, errors, fused_state), daemon=True)
    proc.start()
    try:
        receiver = WeightGroupMember("gloo", "127.0.0.1", port, 1, 2, HANG_S, BUCKET_BYTES)
        for version in (1, 2):
            sent.clear()
            got, held = {}, []
            for name, tensor in receiver.receive_stream(version, specs):
                held.append((name, tensor))
                group = name.rsplit(".", 2)[0]
                if name.endswith((".v.weight", ".up.weight")) or group == "m":  # the layer is complete: load it
                    if len({t.untyped_storage().data_ptr() for _, t in held}) > 1:
                        sent.wait(HANG_S)  # parts from two buffers: let the next bucket land before loading
                    got.update((n, t.clone()) for n, t in held)
                    held = []
            want = fused_state(version)
            assert list(got) == list(want)
            for name, t in want.items():
                assert torch.equal(got[name], t), f"version {version}: {name} was overwritten before it was loaded"
        receiver.close()
    finally:
        proc.join(HANG_S)
        assert errors.empty(), errors.get()
        assert proc.exitcode == 0
