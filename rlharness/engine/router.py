"""EngineRouter: several engines behind one RolloutEngine interface.

Each request goes to the engine with the fewest requests in flight (the first such
engine on ties); abort and weight loads fan out to every engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine


class EngineRouter(RolloutEngine):
    def __init__(self, engines: list[RolloutEngine]) -> None:
        if not engines:
            raise ValueError("EngineRouter needs at least one engine")
        self.engines = list(engines)
        self._in_flight = [0] * len(self.engines)
        self.supports_abort = all(e.supports_abort for e in self.engines)

    @property
    def version(self) -> int:
        # Weight loads fan out together; the oldest engine is the honest answer while one lags.
        return min(e.version for e in self.engines)

    def in_flight(self) -> list[int]:
        return list(self._in_flight)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        i = min(range(len(self.engines)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            return await self.engines[i].generate(request)
        finally:
            self._in_flight[i] -= 1

    async def abort_all(self) -> int:
        return sum(await asyncio.gather(*(e.abort_all() for e in self.engines)))

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        await asyncio.gather(*(e.load_weights(state, version) for e in self.engines))

    async def sleep(self) -> None:
        await asyncio.gather(*(e.sleep() for e in self.engines))

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines))

    def stats(self) -> dict[str, float]:
        """Counters summed over engines; `busy_frac` is their mean."""
        per = [e.stats() for e in self.engines]
        out: dict[str, float] = {}
        for st in per:
            for k, v in st.items():
                out[k] = out.get(k, 0.0) + float(v)
        if "busy_frac" in out:
            out["busy_frac"] /= len(per)
        return out
