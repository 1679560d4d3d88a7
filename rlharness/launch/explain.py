"""`python train.py ... explain=true`: what the composed config means per step, before anything starts.

Prints, without building a component or creating a run directory (preflight calls it right after
composing): the prompts and samples of a step, the groups in flight and over-sampled, the tokens
generated at most, the micro-batches per rank and optimizer steps per batch, the staleness a sample
may reach, the weight syncs, evals and checkpoints of the run, the memory one training micro-batch of
the longest sample needs (from the model's config.json: rlharness/trainer/memory_estimate.py), and
every setting that is legal but suspicious. `Explanation` holds the numbers a run then logs
(tests/health/test_explain.py compares them with a real run's metrics.jsonl).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import psutil

from rlharness.config.run import RunConf
from rlharness.config.schema import (AsyncStrategyConf, OpenAIGatewayAgentConf, RemoteJudgerConf, TaskConf)
from rlharness.producer.progress import BatchAllocation
from rlharness.producer.staleness import stale_threshold
from rlharness.trainer.memory_estimate import ModelShape, model_shape, training_memory_mb
from rlharness.trainer.probe import longest_micro_batch_rows
from rlharness.trainer.zero_signal import greedy_reason


@dataclass
class Explanation:
    samples_per_step: int
    groups_in_flight: int
    tokens_generated_at_most: int
    optimizer_steps: int
    micro_batches_per_rank: int  # over the whole step (all epochs and mini-batches)
    micro_batches_exact: bool  # False with backend.micro_batch_tokens: an upper bound
    max_staleness: int | None  # per token; None: not bounded (admission mode continues groups)
    weight_syncs: int  # over the run, steps 1..total_steps
    evals: int  # over the run, step 0 included
    checkpoints: int
    longest_sample_tokens: int | None
    memory_mb: dict[str, float] | None
    lines: list[str] = field(default_factory=list)
    suspicious: list[str] = field(default_factory=list)

    def text(self) -> str:
        out = list(self.lines)
        out.append("suspicious (legal, but check):" if self.suspicious else "suspicious: nothing found")
        out += [f"  - {s}" for s in self.suspicious]
        return "\n".join(out)


def mini_batch_rows(rows: int, mini_batches: int) -> list[int]:
    """Rows of each non-empty mini-batch, as the backends split them (torch.tensor_split)."""
    q, r = divmod(rows, mini_batches)
    return [n for n in [q + 1] * r + [q] * (mini_batches - r) if n > 0]


def micro_batches(rows: int, workers: int, micro_batch_size: int, budget: int | None, longest: int | None) -> int:
    """Micro-batches one rank runs for one mini-batch of `rows` (at most, with a token budget)."""
    per_rank = math.ceil(rows / workers)
    if budget is None:
        return math.ceil(per_rank / micro_batch_size)
    fit = max(1, budget // longest) if longest else 1
    return math.ceil(per_rank / fit)


def run_steps(total: int, every: int) -> set[int]:
    return {t for t in range(1, total + 1) if every > 0 and t % every == 0}


def lora_params(shape: ModelShape, rank: int) -> int:
    """Adapter parameters on the attention and MLP projections of every layer (the default targets)."""
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    per_layer = rank * ((h + q) * 2 + (h + kv) * 2 + (h + i) * 3)
    return per_layer * shape.layers


def explain(conf: RunConf) -> Explanation:
    samples = conf.batch_size * conf.sampler.prompt_repeat_k
    shape, positions, longest = _longest(conf)
    lines: list[str] = []
    groups_in_flight, tokens = _production(conf, lines)
    optimizer_steps, micros, minis = _training(conf, longest, lines)
    max_stale, syncs, evals, saves = _staleness_and_schedule(conf, lines)
    memory = _memory(conf, shape, longest, lines)
    return Explanation(
        samples_per_step=samples, groups_in_flight=groups_in_flight, tokens_generated_at_most=tokens,
        optimizer_steps=optimizer_steps, micro_batches_per_rank=micros,
        micro_batches_exact=getattr(conf.backend, "micro_batch_tokens", None) is None,
        max_staleness=max_stale, weight_syncs=syncs, evals=evals, checkpoints=saves, longest_sample_tokens=longest,
        memory_mb=memory, lines=lines, suspicious=suspicious(conf, samples, positions, longest) + too_big(conf, memory))


def _production(conf: RunConf, lines: list[str]) -> tuple[int, int]:
    """Prompts and samples of a step, the groups in flight, the tokens generated at most."""
    entries = conf.task_entries()
    k = conf.sampler.prompt_repeat_k
    lines.append(f"per step: {conf.batch_size} prompt groups x {k} samples = {conf.batch_size * k} samples "
                 f"(batch_size x sampler.prompt_repeat_k)")
    if conf.tasks:
        split = BatchAllocation(conf.batch_size, {n: e.weight for n, e in entries.items()}).sizes(1)
        lines.append("  tasks at step 1: " + ", ".join(f"{n} {g} groups" for n, g in split.items())
                     + " (split by weight, the remainder carried to the next steps)")
    extra = 0
    if isinstance(conf.strategy, AsyncStrategyConf):
        for e in entries.values():
            share = math.ceil(conf.batch_size * e.weight / sum(x.weight for x in entries.values()))
            threshold = (conf.strategy.over_sample_threshold if e.over_sample_threshold is None
                         else e.over_sample_threshold)
            extra += math.ceil(threshold * share)
        lines.append(f"in flight: up to {conf.batch_size + extra} groups ({conf.batch_size} for the step + {extra} "
                     f"over-sampled, strategy.over_sample_threshold); leftovers are trained at later steps"
                     + (", interrupted samples keep their tokens (partial rollout)"
                        if conf.strategy.enable_partial_rollout else ""))
    else:
        lines.append(f"in flight: exactly the step's {conf.batch_size} groups (strategy=sync); a filtered or failed "
                     f"group is replaced by a new one")
    budgets = {n: conf.sampling_for(e).max_tokens for n, e in entries.items()}
    groups = conf.batch_size + extra
    tokens = groups * k * max(budgets.values())
    lines.append(f"tokens generated at most: {tokens} per step ({groups} groups x {k} samples x "
                 f"{max(budgets.values())} tokens, agent.sampling.max_tokens"
                 + (f"; per task {budgets}" if conf.tasks else "") + ")"
                 + (" plus refills of filtered groups" if conf.strategy.group_filter != "none" else ""))
    return groups, tokens


def _training(conf: RunConf, longest: int | None, lines: list[str]) -> tuple[int, int, list[int]]:
    """(optimizer steps, micro-batches per rank, rows of each mini-batch) of one training step."""
    algo, workers = conf.algo, conf.backend.workers
    samples = conf.batch_size * conf.sampler.prompt_repeat_k
    minis = mini_batch_rows(samples, algo.mini_batches)
    optimizer_steps = algo.ppo_epochs * len(minis)
    budget = getattr(conf.backend, "micro_batch_tokens", None)
    micros = algo.ppo_epochs * sum(micro_batches(n, workers, algo.micro_batch_size, budget, longest) for n in minis)
    lines.append(f"training: {samples} rows in {len(minis)} mini-batch(es) of {minis[0]} rows (algo.mini_batches="
                 f"{algo.mini_batches}) x {algo.ppo_epochs} epoch(s) = {optimizer_steps} optimizer step(s) per batch")
    lines.append(f"  per rank ({workers} rank(s)): {micros} micro-batch(es) per step, "
                 + (f"{algo.micro_batch_size} rows each at most (algo.micro_batch_size)" if budget is None else
                    f"at most (backend.micro_batch_tokens={budget}, rows grouped by length; the longest sample "
                    f"{longest} tokens)")
                 + (f"; plus a no-grad pass for the old log-probs (algo.proximal=recompute, {optimizer_steps} updates)"
                    if optimizer_steps > 1 and algo.proximal == "recompute" else "")
                 + ("; plus the reference model's pass (algo.kl_coef)" if algo.kl_coef > 0 else ""))
    return optimizer_steps, micros, minis


def _staleness_and_schedule(conf: RunConf, lines: list[str]) -> tuple[int | None, int, int, int]:
    """(the staleness a token may reach, weight syncs, evals and checkpoints over the run)."""
    w = conf.sync_weights_interval
    if not isinstance(conf.strategy, AsyncStrategyConf):
        max_stale = w - 1
        lines.append(f"staleness: {max_stale} (strategy=sync: each step samples with the weights of the last sync)")
    elif conf.strategy.staleness_mode == "token":
        threshold = stale_threshold(conf.max_staleness, w)
        max_stale = threshold - 1
        lines.append(f"staleness: a trained token is at most {max_stale} weight version(s) old ((max_staleness "
                     f"+ 1) x sync_weights_interval - 1); a group reaching {threshold} expires and is resampled")
    else:
        max_stale = None
        lines.append(f"staleness: a group starts at most {stale_threshold(conf.max_staleness, w) - 1} version(s) "
                     f"behind (admission mode); started groups continue on newer weights, so a token's staleness "
                     f"is not bounded")
    eval_steps = run_steps(conf.total_steps, conf.eval_every) | {conf.total_steps}
    sync_steps = run_steps(conf.total_steps, w) | eval_steps
    save_steps = run_steps(conf.total_steps, conf.save_every) | {conf.total_steps}
    lines.append(f"weight syncs: {len(sync_steps)} over {conf.total_steps} steps (every {w} step(s), "
                 f"sync_weights_interval, and before every eval)")
    lines.append(f"evals: {len(eval_steps) + 1} (step 0, every {conf.eval_every or '-'} steps and the last) of "
                 f"{conf.eval.num_prompts} prompts; checkpoints: {len(save_steps)} (save_every={conf.save_every}, "
                 f"keep_checkpoints={conf.keep_checkpoints})")
    return max_stale, len(sync_steps), len(eval_steps) + 1, len(save_steps)


def _memory(conf: RunConf, shape: ModelShape | None, longest: int | None, lines: list[str]) -> dict[str, float] | None:
    """The memory one training micro-batch of the longest sample needs, from the model's shape."""
    if shape is None or longest is None:
        lines.append("memory: the model's config.json does not tell its shape or the prompt length is unbounded")
        return None
    algo, backend, lora = conf.algo, conf.backend, conf.model.lora
    rows = longest_micro_batch_rows(conf, longest)
    memory = training_memory_mb(
        shape, dtype=conf.model.dtype, trainable_params=lora_params(shape, lora.rank) if lora.enabled
        else shape.parameters, rows=rows, seq_len=longest, response_tokens=conf.max_response_tokens(),
        chunk_tokens=getattr(backend, "logprob_chunk_tokens", 1024), reference=algo.kl_coef > 0 and not lora.enabled,
        gradient_checkpointing=getattr(backend, "gradient_checkpointing", False),
        eager_attention=conf.model.attn_implementation == "eager")
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in memory.items() if k != "total" and v >= 0.5)
    lines.append(f"memory of one training micro-batch of the longest sample ({rows} rows x {longest} tokens; "
                 f"model {shape.parameters / 1e6:.1f}M parameters, {shape.layers} layers, hidden {shape.hidden}, "
                 f"vocabulary {shape.vocab}): about {memory['total']:,.0f} MB per rank ({parts} MB)"
                 + ("; task.max_prompt_tokens=0 lets a prompt take the model's positions minus the budget: set it "
                    "to your data's longest prompt for the figure of your data (trainer.probe_longest measures "
                    "that one at start)" if any(e.task.max_prompt_tokens == 0 for e in conf.task_entries().values())
                    else ""))
    return memory


def too_big(conf: RunConf, memory: dict[str, float] | None) -> list[str]:
    """A CPU-trained micro-batch of the longest sample that needs more than this machine's memory."""
    if memory is None or getattr(conf.backend, "device", "cpu") != "cpu":
        return []
    total = psutil.virtual_memory().total / 2**20
    if memory["total"] <= total:
        return []
    return [f"one training micro-batch of the longest sample the config allows needs about {memory['total']:,.0f} MB, "
            f"more than this machine's {total:,.0f} MB: lower algo.micro_batch_size (or set "
            f"backend.micro_batch_tokens), task.max_prompt_tokens or agent.sampling.max_tokens"]


def _longest(conf: RunConf) -> tuple[ModelShape | None, int | None, int | None]:
    """(the model's shape, its positions, the longest sample in tokens: the longest prompt the config allows
    plus its task's response budget), None where the model's config.json does not say."""
    shape = model_shape(conf.model.path)
    positions = shape.positions if shape is not None else None
    longest = None
    for entry in conf.task_entries().values():
        budget = conf.sampling_for(entry).max_tokens
        prompt = prompt_limit(entry.task, positions, budget)
        if prompt is not None:
            longest = max(longest or 0, prompt + budget)
    return shape, positions, longest


def prompt_limit(task: TaskConf, positions: int | None, budget: int) -> int | None:
    """The longest prompt a task's data may hold (rlharness/data/prompt_length.py checks it at load)."""
    if task.max_prompt_tokens > 0:
        return task.max_prompt_tokens
    return positions - budget if positions else None


def suspicious(conf: RunConf, samples: int, positions: int | None, longest: int | None) -> list[str]:
    """Settings that are legal but rarely what was meant, each with its keys and numbers."""
    out = []
    algo, backend = conf.algo, conf.backend
    if algo.mini_batches > samples:
        out.append(f"algo.mini_batches={algo.mini_batches} > {samples} samples per step: "
                   f"{algo.mini_batches - samples} mini-batch(es) are empty (gradient accumulation of zero), "
                   f"so a step takes {samples} optimizer step(s), not {algo.mini_batches}")
    per_mini = samples // algo.mini_batches
    if backend.workers > 1 and 0 < per_mini < backend.workers:
        out.append(f"{per_mini} rows per mini-batch across backend.num_workers={backend.workers} ranks: some ranks "
                   f"train padding only")
    budget = getattr(backend, "micro_batch_tokens", None)
    if budget is not None and longest is not None and budget < longest:
        out.append(f"backend.micro_batch_tokens={budget} is below the longest sample the config allows ({longest} "
                   f"tokens): such rows train alone in their micro-batch")
    for name, entry in conf.task_entries().items():
        agent = conf.agent_for(entry)
        where = f"tasks.{name}." if conf.tasks else ""
        budget_tokens = agent.sampling.max_tokens
        if isinstance(agent, OpenAIGatewayAgentConf) and agent.judge_timeout_s > agent.timeout_s:
            out.append(f"{where}agent.judge_timeout_s={agent.judge_timeout_s:g} is longer than {where}agent.timeout_s="
                       f"{agent.timeout_s:g}: the agent's group times out before its judging may")
        judger = conf.judger_for(entry)
        if isinstance(judger, RemoteJudgerConf):
            worst = judger.timeout_s * (judger.max_retries + 1) + min(
                judger.backoff_max_s, judger.backoff_s * (2 ** judger.max_retries - 1))
            if worst > agent.judge_timeout_s:
                out.append(f"{where}judger.timeout_s={judger.timeout_s:g} x (max_retries={judger.max_retries} + 1) "
                           f"plus back-offs ({worst:g} s) exceed {where}agent.judge_timeout_s="
                           f"{agent.judge_timeout_s:g}: the last retries never run")
        if positions is not None:
            prompt = entry.task.max_prompt_tokens
            if prompt and prompt + budget_tokens > positions:
                out.append(f"{where}task.max_prompt_tokens={prompt} + agent.sampling.max_tokens={budget_tokens} = "
                           f"{prompt + budget_tokens} is above the model's {positions} positions "
                           f"(max_position_embeddings): the longest samples run past its context")
            elif budget_tokens >= positions:
                out.append(f"{where}agent.sampling.max_tokens={budget_tokens} is not below the model's {positions} "
                           f"positions: no room for a prompt")
        reason = greedy_reason(agent.sampling, f"{where}agent.sampling")
        if reason and algo.advantage != "gae":
            out.append(f"{reason} with algo.advantage={algo.advantage}: every sample of a group is the same, so no "
                       f"group carries a learning signal")
    if conf.eval_every > conf.total_steps:
        out.append(f"eval_every={conf.eval_every} > total_steps={conf.total_steps}: only the final eval runs")
    if conf.save_every > conf.total_steps:
        out.append(f"save_every={conf.save_every} > total_steps={conf.total_steps}: only the final checkpoint")
    if conf.sync_weights_interval > conf.total_steps:
        out.append(f"sync_weights_interval={conf.sync_weights_interval} > total_steps={conf.total_steps}: the "
                   f"engines sample with the starting weights until an eval syncs them")
    if algo.warmup_steps >= conf.total_steps:
        out.append(f"algo.warmup_steps={algo.warmup_steps} >= total_steps={conf.total_steps}: the LR never leaves "
                   f"its warm-up")
    if (isinstance(conf.strategy, AsyncStrategyConf) and conf.strategy.over_sample_threshold == 0
            and conf.max_staleness == 0):
        out.append("strategy=async with over_sample_threshold=0 and max_staleness=0: nothing runs ahead, the "
                   "run is synchronous in effect")
    return out
