"""What the agent gateway costs over the built-in tool loop, and what a parallel-calls agent trains per second.

The same groups (experiment=chat_tools' task, tiny-chat, 40 tokens, seeds equal) go through
`agent=multi_turn_tool`, through `agent=openai_gateway` with examples/gateway_calculator_agent.py
(agent processes, HTTP, the openai client, chat-template rendering, the token audit), and through
the gateway with examples/gateway_parallel_agent.py (4 calculator conversations of one sample at
once: 4 branches per sample, `agent.max_total_tokens=160`), alternately, `--rounds` times each
after one warm-up round (it starts the agent processes). Prints per loop the mean seconds per round,
the trained (model-sampled) tokens per second, the gateway's ratio to the built-in loop, and whether
the sequential agent's trained tokens were identical to the built-in loop's.

    python benchmarks/gateway_overhead.py --groups 4 --k 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from rlharness.agent import build_agent_loop
from rlharness.config.schema import (MathJudgerConf, ModelConf, MultiTurnToolAgentConf, OpenAIGatewayAgentConf,
                                     SamplingConf)
from rlharness.core.types import make_group
from rlharness.engine.hf import HFEngine
from rlharness.judger.math import MathJudger
from rlharness.model.load import PROJECT_ROOT, load_model, load_tokenizer, text_codec
from rlharness.trainer.batch import training_rows

ASSET = PROJECT_ROOT / "assets" / "tiny-chat"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    conf = ModelConf(path=str(ASSET))
    tok, model = load_tokenizer(conf), load_model(conf)
    encode, decode = text_codec(tok)
    rows = [json.loads(line) for line in (ASSET / "data" / "tools_train.jsonl").read_text().splitlines()]
    sampling = SamplingConf(max_tokens=40)
    loops = {"multi_turn_tool": MultiTurnToolAgentConf(sampling=sampling, max_turns=2),
             "openai_gateway": OpenAIGatewayAgentConf(sampling=sampling),
             "openai_gateway, 4 parallel paths": OpenAIGatewayAgentConf(
                 sampling=sampling, entrypoint="examples.gateway_parallel_agent:run", max_total_tokens=160)}

    def groups(templated: bool, offset: int):
        out = []
        for i in range(offset, offset + args.groups):
            q = rows[i]["question"]
            text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            out.append(make_group(task="t", prompt_index=i, epoch=0, prompt_text=text if templated else q,
                                  prompt_ids=encode(text), label={"answer": rows[i]["answer"].rsplit("####", 1)[1]},
                                  k=args.k, seed=1))
        return out

    async def go():
        engine = HFEngine.from_model(model, tok)
        built = {name: build_agent_loop(c, engine, MathJudger(MathJudgerConf(fallback_last_number=False)), decode,
                                        encode=lambda t: tok.encode(t, add_special_tokens=False), tokenizer=tok)
                 for name, c in loops.items()}
        times = {name: [] for name in loops}
        tokens = {name: 0 for name in loops}
        same = True
        for r in range(args.rounds + 1):  # round 0 warms up (the agent processes start)
            got = {}
            for name, loop in built.items():
                gs = groups(name == "multi_turn_tool", r * args.groups)
                t = time.perf_counter()
                await asyncio.gather(*(loop.generate_group(g, enable_partial_rollout=True) for g in gs))
                if r == 0:
                    continue
                times[name].append(time.perf_counter() - t)
                samples = [s for g in gs for s in g]
                tokens[name] += sum(sum(mask) for s in samples for *_, mask in training_rows(s))
                got[name] = [(s.prompt_ids, s.response_ids, s.loss_mask()) for s in samples]
            if r:
                same &= got["multi_turn_tool"] == got["openai_gateway"]
        for loop in built.values():
            await loop.close()
        await engine.close()
        return times, tokens, same

    times, tokens, same = asyncio.run(go())
    mean = {name: sum(v) / len(v) for name, v in times.items()}
    base = mean["multi_turn_tool"]
    for name, v in times.items():
        rate = tokens[name] / sum(v)
        print(f"{name}: {mean[name]:.2f} s per round of {args.groups}x{args.k} samples "
              f"({', '.join(f'{x:.2f}' for x in v)}); {rate:.0f} trained tokens/s; {mean[name] / base:.2f}x")
    print(f"sequential gateway trained tokens identical to the built-in loop's: {same}")


if __name__ == "__main__":
    main()
