"""Bad LoRA settings are refused at the door: one `error:` line naming the key, exit 2, no directory.

The other keys (alpha, dropout, sync) are refused by the same schema check: tests/backend/test_lora_backend.py."""

from __future__ import annotations

import pytest

from tests.faults.test_refused_input import SIM, refused

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.parametrize("args, expect", [
    (["model.lora.rank=-1"], ["model.lora.rank=-1", ">= 0"]),
    (["model.lora.rank=4", "model.lora.target_modules=[q_proj,qkv_proj]"],
     ["model.lora.target_modules", "'qkv_proj' matches no module", "down_proj, gate_proj, k_proj, lm_head, o_proj"]),
])
def test_bad_lora_settings_are_one_line_exit_2(tmp_path, args, expect):
    refused([*SIM, *args], tmp_path, expect)
    assert not (tmp_path / "outputs").exists()
