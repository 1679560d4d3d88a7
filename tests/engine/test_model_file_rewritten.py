"""A model file rewritten in place while a run holds the model loaded does not change its weights.

transformers maps safetensors files privately: until the process writes a page, the page reads the
file. Without `rlharness.model.load.own_memory` the engine (before its first weight sync) and a frozen KL
reference computed with whatever the file held at that moment; and a file truncated and written again
(`open(path, "wb")`: a copy, a re-fetch) took back even the pages a weight sync had written, so an
engine went back to the file's weights mid-run (docs/notes/resume_race.md).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
from pathlib import Path

import torch

from rlharness.config.schema import HFEngineConf, ModelConf
from rlharness.engine.hf import HFEngine
from rlharness.model.load import load_model
from tests.helpers import ROOT


def rewrite_in_place(path: Path) -> None:
    """Add 1 to every tensor of a float32 safetensors file, through the same inode (no new file)."""
    raw = path.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + header_len])
    header.pop("__metadata__", None)
    with open(path, "r+b") as fh:
        for meta in header.values():
            start, end = (8 + header_len + o for o in meta["data_offsets"])
            values = torch.frombuffer(bytearray(raw[start:end]), dtype=torch.float32) + 1.0
            fh.seek(start)
            fh.write(values.numpy().tobytes())


def test_loaded_weights_stay_when_the_model_file_is_rewritten_in_place(tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(ROOT / "assets" / "tiny-arith", model_dir)
    conf = ModelConf(path=str(model_dir))
    policy = load_model(conf)  # what the trainer loads (policy and KL reference)
    engine = HFEngine(HFEngineConf(), conf)
    try:
        loaded = {name: {k: v.clone() for k, v in m.state_dict().items()}
                  for name, m in (("policy", policy), ("engine", engine.model))}
        rewrite_in_place(model_dir / "model.safetensors")
        assert load_model(conf).model.norm.weight[0] == loaded["policy"]["model.norm.weight"][0] + 1  # it was rewritten
        for name, m in (("policy", policy), ("engine", engine.model)):
            changed = [k for k, v in m.state_dict().items() if not torch.equal(v, loaded[name][k])]
            assert not changed, f"{name}: {changed} changed with the file"
            assert m.lm_head.weight is m.model.embed_tokens.weight  # still tied
    finally:
        asyncio.run(engine.close())


def test_synced_weights_stay_when_the_model_file_is_truncated_and_written_again(tmp_path):
    """A truncation drops a private map's copied-on-write pages too (the kernel unmaps them with the
    file's): without own memory the engine's synced weights would read the file's again."""
    model_dir = tmp_path / "model"
    shutil.copytree(ROOT / "assets" / "tiny-arith", model_dir)
    conf = ModelConf(path=str(model_dir))
    engine = HFEngine(HFEngineConf(), conf)
    try:
        synced = {k: v + 0.5 for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
        asyncio.run(engine.load_weights(synced, 1))  # a resume's (or any step's) weight sync
        path = model_dir / "model.safetensors"
        path.write_bytes(path.read_bytes())  # the same bytes, through O_TRUNC on the same inode
        got = engine.model.state_dict()
        reverted = [k for k, v in synced.items() if not torch.equal(got[k], v)]
        assert not reverted, f"{reverted} went back to the file's values"
    finally:
        asyncio.run(engine.close())
