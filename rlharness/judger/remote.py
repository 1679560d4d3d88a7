"""Remote judger: POST {"response", "label"} as JSON to `url`, read {"score": ...} back.

Other numeric keys in the reply are kept in the reward. An unreachable server, an
HTTP error, a timeout or a reply without a numeric "score" raises (RemoteJudgeError),
so `Judger.judge_group` marks the group FAILED rather than scoring it 0.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from rlharness.config.schema import ConfigError, RemoteJudgerConf
from rlharness.judger.base import Judger


class RemoteJudgeError(RuntimeError):
    pass


class RemoteJudger(Judger):
    name = "remote"

    def __init__(self, conf: RemoteJudgerConf | None = None):
        self.conf = conf or RemoteJudgerConf()
        if not self.conf.url.startswith(("http://", "https://")):
            raise ConfigError(f"judger.url={self.conf.url!r} is not allowed: expected an http:// or https:// URL")
        if self.conf.timeout_s <= 0:
            raise ConfigError(f"judger.timeout_s={self.conf.timeout_s!r} is not allowed: expected > 0")

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        body = json.dumps({"response": response_text, "label": label}).encode("utf-8")
        request = urllib.request.Request(self.conf.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.conf.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
            raise RemoteJudgeError(f"{self.conf.url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise RemoteJudgeError(f"{self.conf.url}: {exc}") from None
        try:
            result = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RemoteJudgeError(f"{self.conf.url}: reply is not JSON ({exc.msg}): {raw[:200]!r}") from None
        if not isinstance(result, dict) or not _is_number(result.get("score")):
            raise RemoteJudgeError(f"{self.conf.url}: reply has no numeric 'score': {raw[:200]!r}")
        return {k: float(v) for k, v in result.items() if _is_number(v)}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
