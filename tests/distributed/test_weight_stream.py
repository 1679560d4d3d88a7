"""The weight group's pipelined transfer: bucket k+1 is on the wire while the receiver loads bucket k,
and what arrives is the sender's exact tensors (two processes, gloo, no Ray)."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch

from rlharness.weight_transfer import WeightGroupMember, plan_buckets, tensor_specs

pytestmark = pytest.mark.timeout(120)

BUCKET_BYTES = 4096


def state(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"a": torch.randn(600, generator=g), "c": torch.randn(3, 250, generator=g)}  # 2400 + 3000 bytes


def _sender(port: int, sent, errors) -> None:
    try:
        member = WeightGroupMember("gloo", "127.0.0.1", port, 0, 2, 30.0, BUCKET_BYTES)
        for version in (1, 2):
            member.send(state(version), version)
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
        receiver = WeightGroupMember("gloo", "127.0.0.1", port, 1, 2, 30.0, BUCKET_BYTES)
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
                    assert sent.wait(20), "the sender could not finish while bucket 0 was being loaded"
                got[name] = tensor.clone()
            want = state(version)
            assert list(got) == list(want)
            for name, t in want.items():
                assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
        receiver.close()
    finally:
        proc.join(30)
        assert errors.empty(), errors.get()
        assert proc.exitcode == 0
