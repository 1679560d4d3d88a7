"""Typed configuration: one dataclass schema per implementation, the single home of defaults.

Hydra composes YAML from `conf/` on top of these schemas (registered in
`rlharness.config.store`); `OmegaConf.to_object` turns the result into these
dataclasses once at the entry, and each `__post_init__` refuses a bad value before
anything starts, naming the key, the value and what is allowed.

Each component receives its own sub-config (e.g. the sampler gets `SamplerConf`),
never the whole run's (`RunConf`, rlharness/config/run.py, which holds these).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar, Optional

from omegaconf import II, MISSING


class ConfigError(ValueError):
    """A configuration value that cannot work. The message names the key."""


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    # NaN fails every comparison but inf passes `> 0`: a non-finite number is refused whatever the range says.
    if not ok or not _finite(value):
        raise ConfigError(f"{key}={value!r} is not allowed: expected {'a finite number, ' if not _finite(value) else ''}"
                          f"{allowed}")


def _finite(value: Any) -> bool:
    """False for a non-finite float (or a tuple holding one); True for anything else."""
    if isinstance(value, tuple):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def non_finite_values(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    """(key, value) of every non-finite float in a config tree (dataclasses, dicts, lists), keys dotted.

    One generic pass (RunConf runs it first), so a float key added later is covered without its own
    check; the per-key ranges stay with each schema."""
    if is_dataclass(obj):
        items = [(f.name, getattr(obj, f.name)) for f in fields(obj)]
    elif isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    else:
        return [(prefix.rstrip("."), obj)] if isinstance(obj, float) and not math.isfinite(obj) else []
    found = []
    for name, value in items:
        found += non_finite_values(value, f"{prefix}{name}.")
    return found


def _one_of(key: str, value: Any, options: tuple) -> None:
    _check(value in options, key, value, "one of " + ", ".join(map(str, options)))


# Where models go (whether this machine has the device: rlharness/launch/devices.py).
DEVICES = "cpu, cuda or cuda:N (a device index)"


def _check_device(key: str, device: str) -> None:
    _check(re.fullmatch(r"cpu|cuda(:\d+)?", str(device)) is not None, key, device, DEVICES)


# A config value "env:NAME" names an environment variable read at use (secrets stay out of files).
ENV_PREFIX = "env:"


def refuse_url_credentials(key: str, url: str | None) -> None:
    """A URL with user:password@ would be written into .hydra/, the log and W&B: refused (the
    message leaves the credentials out)."""
    from urllib.parse import urlsplit

    if url is None:
        return
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        shown = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()
        raise ConfigError(
            f"{key}={shown} (with user:password@ in it) is not allowed: credentials in a URL are written into "
            f".hydra/, the log and W&B; put them in judger.headers as an environment variable, e.g. "
            f"+judger.headers.Authorization=env:JUDGE_TOKEN with JUDGE_TOKEN exported")


_CHAR_NAMES = {"\r": "a carriage return (\\r: a file edited on Windows?)", "\n": "a line feed (\\n)",
               "\t": "a tab at its start or end", " ": "a space at its start or end", "\x00": "a NUL byte"}


def header_value_problem(value: str) -> str | None:
    """Why `value` cannot be sent as an HTTP header value (RFC 7230 field-value: visible ASCII characters,
    spaces and tabs between them; httpx sends ASCII), or None. Says where and what, never the value."""
    for i, ch in enumerate(value):
        inner = 0 < i < len(value) - 1
        if "\x21" <= ch <= "\x7e" or (ch in " \t" and inner):
            continue
        what = _CHAR_NAMES.get(ch) or (f"a control character (U+{ord(ch):04X})" if ord(ch) < 0x20 or ord(ch) == 0x7F
                                       else f"a non-ASCII character (U+{ord(ch):04X})")
        return f"character {i + 1} of {len(value)} is {what}"
    return None


# What algo.failed_member_policy may say (rlharness/core/member_failures.py).
FAILED_MEMBER_POLICIES = ("mask", "zero", "drop_group")

# ----------------------------------------------------------------------------- strategy
STALENESS_MODES = ("token", "admission")


@dataclass
class StrategyConf:
    name: str = MISSING
    # A weight version may lag the trained step by at most this many syncs. Another spelling of
    # the top-level max_staleness, kept at the config edge (adopt_strategy_max_staleness).
    max_staleness: int = II("max_staleness")
    # Drop groups that carry no learning signal ("none" | "all_equal_reward", as DAPO).
    group_filter: str = "none"
    # How long a pause (weight sync) waits for in-flight groups before aborting them.
    pause_timeout_s: float = 60.0
    # What max_staleness bounds. token: every trained token's staleness (a group expires as
    # soon as its oldest token is too stale). admission: a group may start only while the step
    # it is admitted for is within max_staleness of the engines' weights (AReaL's
    # max_head_offpolicyness); a started group never expires, and partial rollout continues it
    # on newer weights (per-token versions; pair it with the decoupled objective, algo.proximal).
    staleness_mode: str = "token"
    # Without partial rollout an interrupted group restarts from scratch, with the same seeds: one
    # longer than the time between syncs never finishes. After this many interruptions it is
    # FAILED (reason in rollouts/dropped.jsonl, counted in rollout/groups_abort_capped); 0 = never.
    max_aborts: int = 8

    def __post_init__(self) -> None:
        _check(isinstance(self.max_staleness, int) and self.max_staleness >= 0,
               "strategy.max_staleness", self.max_staleness, "an integer >= 0")
        _one_of("strategy.staleness_mode", self.staleness_mode, STALENESS_MODES)
        _check(self.max_aborts >= 0, "strategy.max_aborts", self.max_aborts, ">= 0 (0 = never)")
        _one_of("strategy.group_filter", self.group_filter, ("none", "all_equal_reward"))
        _check(self.pause_timeout_s > 0, "strategy.pause_timeout_s", self.pause_timeout_s, "> 0")


@dataclass
class SyncStrategyConf(StrategyConf):
    name: str = "sync"


# More over-sampling than this keeps over 100x the batch in flight: a typo, not a setting.
MAX_OVER_SAMPLE = 100.0


@dataclass
class AsyncStrategyConf(StrategyConf):
    name: str = "async"
    # Keep target + ceil(over_sample_threshold * batch) groups in flight. Leftovers are
    # trained at a later step (that is what makes `strategy=async` asynchronous).
    over_sample_threshold: float = 0.25
    # Interrupted samples keep their tokens and continue later on newer weights.
    enable_partial_rollout: bool = True
    # Once this many EXPIRED groups wait, refill from them only (0 = off).
    tail_batch_trigger_size: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0 <= self.over_sample_threshold <= MAX_OVER_SAMPLE, "strategy.over_sample_threshold",
               self.over_sample_threshold, f"a number from 0 to {MAX_OVER_SAMPLE} (extra groups in flight per "
               f"batch group)")
        _check(self.tail_batch_trigger_size >= 0, "strategy.tail_batch_trigger_size",
               self.tail_batch_trigger_size, "an integer >= 0")


# ----------------------------------------------------------------------------- sampler
def check_prompt_repeat_k(k: Any, advantage: str | None = None, group_filter: str | None = None,
                          task: str | None = None) -> None:
    """Every rule on `sampler.prompt_repeat_k` (the schema, the sampler, RunConf and the producer ask here):
    an integer >= 1, and >= 2 where the group is the baseline (every `advantage` but gae, whose baseline
    is the critic, and opd, which has none) or where `group_filter` drops groups whose rewards are all equal."""
    _check(isinstance(k, int) and k >= 1, "sampler.prompt_repeat_k", k, "an integer >= 1")
    if k < 2 and advantage is not None and advantage not in NO_GROUP_BASELINE:
        raise ConfigError(
            f"sampler.prompt_repeat_k={k} is not allowed with algo.advantage={advantage}: its baseline is the "
            f"group's mean, so a group of one sample has advantage 0 and nothing would be learned; use "
            f"prompt_repeat_k >= 2")
    if k < 2 and group_filter == "all_equal_reward":
        raise ConfigError(f"strategy.group_filter=all_equal_reward with sampler.prompt_repeat_k={k}"
                          + (f" (task {task!r})" if task is not None else "") + " would filter every group")


@dataclass
class SamplerConf:
    # Samples per prompt: a group of k copies of one prompt (GRPO's group size).
    prompt_repeat_k: int = 8
    # Shuffle the training prompts (each epoch anew, from the run's seed).
    shuffle: bool = True
    # When the dataset is exhausted, start a new (reshuffled) epoch; else stop the run.
    allow_epoch_rollover: bool = True

    def __post_init__(self) -> None:
        check_prompt_repeat_k(self.prompt_repeat_k)


# ----------------------------------------------------------------------------- agent
@dataclass
class SamplingConf:
    # Sampling temperature of rollouts; the trainer scores log-probs at the same one.
    temperature: float = 1.0
    # Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = off).
    top_p: float = 1.0
    # Sample among the k most likely tokens (0 = off).
    top_k: int = 0
    # The response budget in tokens (per turn for the tool loop); a longer response is cut.
    max_tokens: int = 8
    # Strings that end a response.
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, "agent.sampling.temperature", self.temperature, ">= 0 (0 = greedy)")
        _check(0 < self.top_p <= 1, "agent.sampling.top_p", self.top_p, "0 < top_p <= 1")
        _check(self.top_k >= 0, "agent.sampling.top_k", self.top_k, ">= 0 (0 = off)")
        _check(self.max_tokens >= 1, "agent.sampling.max_tokens", self.max_tokens, ">= 1")


SANDBOX_ISOLATIONS = ("namespaces", "rlimits")


@dataclass
class SandboxConf:
    """Limits and isolation of one sandboxed Python call (rlharness/sandbox, docs/concepts/sandbox.md); the
    defaults are the safe ones."""

    # namespaces: bubblewrap (user, pid, net, ipc, uts, mount namespaces) + rlimits + seccomp; refused at
    # start where namespaces cannot be created. rlimits: the documented weaker mode for such machines (a
    # process with rlimits and seccomp, no child processes, no network sockets, but it sees the file system).
    isolation: str = "namespaces"
    # The interpreter the code runs with. The sandbox user (nobody when the run is root) must be able
    # to read it; Debian's /usr/bin/python3 has the standard library only.
    python: str = "/usr/bin/python3"
    cpu_s: float = 5.0  # CPU time (RLIMIT_CPU, whole seconds, rounded up)
    wall_s: float = 10.0  # wall time, from the program's hand-over to the sandbox
    memory_mb: int = 512  # address space (RLIMIT_AS)
    max_processes: int = 8  # processes and threads, the code's own included (RLIMIT_NPROC)
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_file_mb: int = 16  # the largest file the code may write (RLIMIT_FSIZE)
    tmp_mb: int = 64  # size of the private /tmp, the only writable place
    max_output_bytes: int = 65536  # stdout and stderr each; the call is stopped when one passes it
    # Sandboxes started ahead and waiting for their program (each still runs one call only): a call
    # then skips the sandbox's start (~2/3 of a short call). 0 = start each on demand.
    warm: int = 2

    def __post_init__(self) -> None:
        _one_of("agent.sandbox.isolation", self.isolation, SANDBOX_ISOLATIONS)
        _check(bool(self.python), "agent.sandbox.python", self.python, "the path of a Python interpreter")
        for key in ("cpu_s", "wall_s"):
            value = getattr(self, key)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
                   f"agent.sandbox.{key}", value, "a number of seconds > 0")
        for key in ("memory_mb", "max_processes", "max_open_files", "max_file_mb", "tmp_mb", "max_output_bytes"):
            value = getattr(self, key)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"agent.sandbox.{key}",
                   value, "an integer >= 1")
        # Below these, Python itself cannot start: every call would fail for no fault of the code.
        _check(self.memory_mb >= 64, "agent.sandbox.memory_mb", self.memory_mb, ">= 64 (the interpreter needs ~30 MB)")
        _check(self.max_open_files >= 8, "agent.sandbox.max_open_files", self.max_open_files, ">= 8")
        _check(isinstance(self.warm, int) and 0 <= self.warm <= 64, "agent.sandbox.warm", self.warm,
               "an integer from 0 (start each call's sandbox on demand) to 64")


@dataclass
class AgentConf:
    name: str = MISSING
    sampling: SamplingConf = field(default_factory=SamplingConf)
    # The most one member's judging may take (a rule judger's worker process is killed
    # then; a remote judger's attempts and back-offs all fit in it); see judger.on_timeout.
    judge_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check(self.judge_timeout_s > 0, "agent.judge_timeout_s", self.judge_timeout_s, "> 0")


@dataclass
class SingleTurnAgentConf(AgentConf):
    name: str = "single_turn"


@dataclass
class MultiTurnToolAgentConf(AgentConf):
    name: str = "multi_turn_tool"
    # Model turns per sample (a turn ends with a tool call or the response's end), so
    # at most max_turns - 1 tool calls are run.
    max_turns: int = 4
    # Tool names the model may call (rlharness/agent/tools.py); the first is the default.
    tools: list[str] = field(default_factory=lambda: ["calculator"])
    # The model calls a tool by writing start + argument + end (generation stops at the
    # end marker); "name: argument" picks a tool other than the first of `tools`.
    tool_call_start: str = "<tool>"
    # End marker of a tool call; generation stops there and the tool runs.
    tool_call_end: str = "</tool>"
    # The loop appends output_start + tool output + output_end (not trained).
    tool_output_start: str = "<output>"
    # End marker of a tool output.
    tool_output_end: str = "</output>"
    # A tool output is cut to this many characters.
    max_tool_output_chars: int = 256
    # Wall time of one call (a python call is stopped then; see also sandbox.wall_s, the smaller wins).
    tool_timeout_s: float = 5.0
    # Per sample: at most max_turns - 1 calls, and this many seconds of tool time in all; a call past
    # the budget is not run (the model is shown "error: ...").
    tool_budget_s: float = 30.0
    tool_workers: int = 2  # tool calls run at once (threads; a python call is a sandboxed process)
    # The python tool's sandbox (`tools: [python]`; rlharness/sandbox, docs/concepts/sandbox.md).
    sandbox: SandboxConf = field(default_factory=SandboxConf)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.max_turns >= 1, "agent.max_turns", self.max_turns, ">= 1")
        _check(len(self.tools) >= 1, "agent.tools", self.tools, "at least one tool name")
        _check(bool(self.tool_call_start), "agent.tool_call_start", self.tool_call_start, "a non-empty string")
        _check(bool(self.tool_call_end) and self.tool_call_end != self.tool_call_start, "agent.tool_call_end",
               self.tool_call_end, "a non-empty string different from agent.tool_call_start")
        # An output must add tokens, or the loop would find the same call again.
        _check(bool(self.tool_output_start), "agent.tool_output_start", self.tool_output_start, "a non-empty string")
        _check(self.max_tool_output_chars >= 1, "agent.max_tool_output_chars", self.max_tool_output_chars, ">= 1")
        _check(self.tool_timeout_s > 0, "agent.tool_timeout_s", self.tool_timeout_s, "> 0")
        _check(self.tool_budget_s > 0, "agent.tool_budget_s", self.tool_budget_s, "> 0")
        _check(self.tool_workers >= 1, "agent.tool_workers", self.tool_workers, ">= 1")


@dataclass
class OpenAIGatewayAgentConf(AgentConf):
    """The user's agent program behind a local gateway that speaks the OpenAI (chat completions,
    completions, Responses) and Anthropic (Messages) APIs (rlharness/agent/openai_gateway.py).
    Its `prompt` is the task row's prompt text: use a task that does not apply the chat template
    (`task.apply_chat_template=false`), since the gateway renders the agent's messages itself."""

    name: str = "openai_gateway"
    # module:function, `fn(row, client)` (async or plain) returning the answer (str) or the reward (number).
    entrypoint: str = "examples.gateway_calculator_agent:run"
    # The client the program is given: openai (openai.AsyncOpenAI, or OpenAI for a plain def) | anthropic
    # (anthropic.AsyncAnthropic / Anthropic). Either way `row["base_url"]` lets it build any other.
    client: str = "openai"
    # The model name the gateway serves (`GET /v1/models`); a request naming another is refused (404).
    model_name: str = "policy"
    # Agent programs running at once, each in a process of its own (a call parked for a weight sync
    # gives its slot back; its process waits).
    max_concurrency: int = 64
    # A member whose agent program is still running this long after it got its slot (or after its
    # group was continued) is stopped (its process killed) and fails for a reason that is not the
    # policy's (algo.failed_member_policy).
    timeout_s: float = 300.0
    # One token budget per sample across all its calls: response tokens, the model's and those its
    # messages add after them, over every token sequence of the sample; past it the next call is
    # refused (400) and the sample ends. None: agent.sampling.max_tokens (the task's budget).
    max_total_tokens: Optional[int] = None
    # A request body over this many bytes is refused (413) before it is read.
    max_request_bytes: int = 1048576
    # Tool calls in the model's text (the convention of agent=multi_turn_tool): start + argument + end,
    # answered inline by output_start + tool message + output_end.
    tool_call_start: str = "<tool>"
    # End marker of a tool call in the model's text.
    tool_call_end: str = "</tool>"
    # Start marker of a tool message rendered into the assistant turn.
    tool_output_start: str = "<output>"
    # End marker of a tool message.
    tool_output_end: str = "</output>"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(":" in self.entrypoint, "agent.entrypoint", self.entrypoint, "module:function")
        _one_of("agent.client", self.client, ("openai", "anthropic"))
        _check(bool(self.model_name), "agent.model_name", self.model_name, "a non-empty string")
        _check(self.max_concurrency >= 1, "agent.max_concurrency", self.max_concurrency, ">= 1")
        _check(self.timeout_s > 0, "agent.timeout_s", self.timeout_s, "> 0")
        _check(self.max_total_tokens is None or (isinstance(self.max_total_tokens, int) and self.max_total_tokens >= 1),
               "agent.max_total_tokens", self.max_total_tokens, "an integer >= 1, or null (agent.sampling.max_tokens)")
        _check(isinstance(self.max_request_bytes, int) and self.max_request_bytes >= 1024, "agent.max_request_bytes",
               self.max_request_bytes, "an integer >= 1024")
        _check(bool(self.tool_call_start) and self.tool_call_end != self.tool_call_start, "agent.tool_call_end",
               self.tool_call_end, "a non-empty string different from agent.tool_call_start")

    @property
    def sample_token_budget(self) -> int:
        """The tokens one sample may take over all its calls (max_total_tokens, else the task's budget)."""
        return self.max_total_tokens if self.max_total_tokens is not None else self.sampling.max_tokens


# ----------------------------------------------------------------------------- judger
@dataclass
class JudgerConf:
    name: str = MISSING



MAX_JUDGE_WORKERS = 256


def check_judging_processes(num_workers: int, worker_memory_mb: int) -> None:
    """A judger's killable processes (rlharness/judger/pool.py): how many, and the memory each may take."""
    _check(1 <= num_workers <= MAX_JUDGE_WORKERS, "judger.num_workers", num_workers,
           f"1..{MAX_JUDGE_WORKERS} (processes started)")
    _check(worker_memory_mb >= 256, "judger.worker_memory_mb", worker_memory_mb, ">= 256")


@dataclass
class RuleJudgerConf(JudgerConf):
    """A judger whose slow scoring (math-verify) runs in worker processes that can be killed.

    Each member's slow scoring may take `agent.judge_timeout_s`; past it (or past the
    memory limit) its worker process is killed and replaced, and the member is handled
    as `on_timeout` says: "fail": the member failed for a reason that is not the policy's
    (`algo.failed_member_policy`: left out of its group's statistics by default, its group
    FAILED with drop_group); "zero": scored 0, as a wrong answer.
    """

    num_workers: int = 2  # judging processes (not threads: a stuck one must be killable)
    worker_memory_mb: int = 2048  # address-space limit of each judging process
    on_timeout: str = "fail"  # fail | zero

    def __post_init__(self) -> None:
        check_judging_processes(self.num_workers, self.worker_memory_mb)
        _one_of("judger.on_timeout", self.on_timeout, ("fail", "zero"))


@dataclass
class AutoJudgerConf(RuleJudgerConf):
    """The task's own judger (`task.default_judger`): its defaults, with these process settings."""

    name: str = "auto"


@dataclass
class MathJudgerConf(RuleJudgerConf):
    name: str = "math"
    # Without '####' or \boxed{}, take the last number in the response (else score 0).
    fallback_last_number: bool = True


@dataclass
class CountdownJudgerConf(RuleJudgerConf):
    name: str = "countdown"


@dataclass
class ReasoningGymJudgerConf(RuleJudgerConf):
    """The dataset's own `score_answer` on the answer taken from the response (rlharness/judger/reasoning_gym.py)."""

    name: str = "reasoning_gym"
    # What of the response is the answer: auto (the last <answer>...</answer>, else the last
    # \boxed{}, else the last number when the reference answer is a number, else the whole
    # response) | answer_tag | boxed | last_number | response (the whole response, stripped).
    extract: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("judger.extract", self.extract, ("auto", "answer_tag", "boxed", "last_number", "response"))


@dataclass
class FormatJudgerConf(RuleJudgerConf):
    name: str = "format"
    # The response must match this regular expression (full match) to score 1.
    pattern: str = r"(?s).*\S.*"


@dataclass
class RewardModelJudgerConf(JudgerConf):
    """A learned reward model: any HF sequence-classification folder (rlharness/judger/reward_model.py).

    It scores the text the policy saw and wrote (the task's prompt, chat-formatted where the
    task applies a template, + the response), re-tokenized with the reward model's own
    tokenizer, in batches, in a process of its own (a Ray actor in mode=disagg).
    score = (logit[label_index] + reward_shift) * reward_scale.
    """

    name: str = "reward_model"
    path: Optional[str] = None  # the folder (required; relative paths as model.path)
    # Where the reward model runs: cpu or cuda.
    device: str = "cpu"
    # The reward model's weights' dtype.
    dtype: str = "float32"
    max_length: int = 512  # tokens scored; longer texts lose their start (the response's end is kept)
    batch_size: int = 16  # texts per forward pass
    # The logit read as the reward: required when the head has more than one label.
    label_index: Optional[int] = None
    # Added to the logit before scaling (centre the scores).
    reward_shift: float = 0.0
    # Multiplies the shifted logit (normalise the scores).
    reward_scale: float = 1.0
    torch_threads: int = 1  # of the scoring process (the trainer and engines share the cores)
    # mode=disagg: CPUs reserved for the reward-model actor (its own placement group; GPU 1 when
    # device is cuda). 0 with a CPU device = no reservation (the actor shares the node's cores).
    num_cpus: float = 0.0
    # A scoring call past agent.judge_timeout_s (or a crashed scoring process): fail the group | score 0.
    on_timeout: str = "fail"
    # Run the folder's own code (config.json auto_map) to load it: only for a folder you trust.
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if non_finite_values(self):
            # Left to RunConf's generic pass, which names the whole key (judger.reward_model.* under
            # judger=router, tasks.<name>.judger.* per task); this class knows only "judger.".
            return
        _one_of("judger.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        _check_device("judger.device", self.device)
        _check(self.max_length >= 2, "judger.max_length", self.max_length, ">= 2")
        _check(self.batch_size >= 1, "judger.batch_size", self.batch_size, ">= 1")
        _check(self.label_index is None or self.label_index >= 0, "judger.label_index", self.label_index,
               "null or >= 0")
        _check(self.reward_scale != 0, "judger.reward_scale", self.reward_scale, "a non-zero number")
        _check(self.torch_threads >= 1, "judger.torch_threads", self.torch_threads, ">= 1")
        _check(self.num_cpus >= 0, "judger.num_cpus", self.num_cpus, ">= 0")
        _one_of("judger.on_timeout", self.on_timeout, ("fail", "zero"))


MAX_RENDERED_CHARS = 1_000_000  # a judge prompt beyond this is no prompt any judge model reads
LLM_JUDGE_TEMPLATE = ("Is the answer to this problem correct? Reply with a score from 0 (wrong) to 10 (right).\n"
                      "Problem: {{ prompt }}\nAnswer: {{ response }}\nScore:")


@dataclass
class LLMJudgerConf(JudgerConf):
    """A generative judge (rlharness/judger/llm.py): `template` (Jinja; `prompt`, `response` and
    `label` in scope) rendered, sent to an engine of its own, and the score parsed with `score_pattern`."""

    name: str = "llm"
    # The judge model: by default the policy's starting checkpoint (its weights frozen: this
    # engine never receives the trained weights), or any causal-LM folder.
    path: str = II("model.path")
    engine: str = "hf"  # hf | vllm
    device: str = "cpu"  # engine=hf
    # Jinja template of the judge's prompt; must use {{ response }} (prompt and label optional).
    template: str = LLM_JUDGE_TEMPLATE
    apply_chat_template: bool = True  # wrap the rendered template as a user turn when the judge has a template
    # The first match's group 1 (else the whole match) is the number read; reward = number * reward_scale + shift.
    score_pattern: str = r"(-?\d+(?:\.\d+)?)"
    # The number read is multiplied by this (0.1: a 0-10 grade becomes 0-1).
    reward_scale: float = 0.1
    # Added after scaling.
    reward_shift: float = 0.0
    # Tokens the judge may write.
    max_tokens: int = 8
    temperature: float = 0.0  # 0 = greedy
    # An answer with no match (counted as judge/unparseable) or none within agent.judge_timeout_s:
    # fail the group | score the member 0. (An engine error always fails the group.)
    on_timeout: str = "fail"
    # Run the judge folder's own code (config.json auto_map) to load it: only for a folder you trust.
    trust_remote_code: bool = False
    # Judging processes that render the template and read the score, killed and replaced past
    # agent.judge_timeout_s (a template with huge loops, a catastrophic score_pattern).
    num_workers: int = 1
    worker_memory_mb: int = 1024  # address-space limit of each of those processes
    max_rendered_chars: int = 16384  # a longer rendering fails its member (and the start, on a task's first row)

    def __post_init__(self) -> None:
        if non_finite_values(self):  # left to RunConf's generic pass (see RewardModelJudgerConf)
            return
        _one_of("judger.engine", self.engine, ("hf", "vllm"))
        _check_device("judger.device", self.device)
        _check(self.max_tokens >= 1, "judger.max_tokens", self.max_tokens, ">= 1")
        _check(self.temperature >= 0, "judger.temperature", self.temperature, ">= 0 (0 = greedy)")
        _one_of("judger.on_timeout", self.on_timeout, ("fail", "zero"))
        check_judging_processes(self.num_workers, self.worker_memory_mb)
        _check(1 <= self.max_rendered_chars <= MAX_RENDERED_CHARS, "judger.max_rendered_chars",
               self.max_rendered_chars, f"1..{MAX_RENDERED_CHARS}")
        try:
            re.compile(self.score_pattern)
        except re.error as exc:
            raise ConfigError(f"judger.score_pattern={self.score_pattern!r} is not allowed: {exc}") from None
        check_judge_template(self.template)


def check_judge_template(template: str, key: str = "judger.template") -> None:
    """A Jinja template that parses and uses `response` (a judge never shown the answer grades nothing)."""
    import jinja2
    from jinja2 import meta

    try:
        used = meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{key} is not allowed: not a Jinja template ({exc.message}, line {exc.lineno})") from None
    if "response" not in used:
        raise ConfigError(f"{key}={template[:80]!r} is not allowed: it has no {{{{ response }}}} placeholder "
                          f"(the judge must be shown the response); it may also use prompt and label")


@dataclass
class RouterJudgerConf(RuleJudgerConf):
    name: str = "router"
    # judger name -> weight; the score is the weighted sum of their scores.
    weights: dict[str, float] = field(default_factory=lambda: {"math": 1.0, "format": 0.1})
    # The regular expression the `format` part matches (full match scores 1).
    format_pattern: str = r"(?s).*\S.*"
    # The configs of the learned parts, used when `weights` names them ("reward_model", "llm").
    reward_model: RewardModelJudgerConf = field(default_factory=RewardModelJudgerConf)
    llm: LLMJudgerConf = field(default_factory=LLMJudgerConf)


@dataclass
class RemoteJudgerConf(JudgerConf):
    name: str = "remote"
    # Where each member is POSTed as {"response", "label"}, answered by {"score": ...}.
    url: str = "http://127.0.0.1:8008/judge"
    # When set, a whole group is judged in one POST {"items": [{"response", "label"}, ...]}
    # answered by {"results": [{"score": ...}, ...]} (same order); else one POST per member.
    batch_url: Optional[str] = None
    timeout_s: float = 10.0  # per HTTP request (each attempt)
    max_concurrent_requests: int = 64  # requests in flight at once, all groups together
    # Connection errors, timeouts, HTTP 429 and 5xx are retried this many times, waiting
    # backoff_s, 2 x backoff_s, ... (at most backoff_max_s, with jitter) in between.
    max_retries: int = 3
    # The first wait before a retry (doubled at each retry).
    backoff_s: float = 0.5
    # The longest wait between retries.
    backoff_max_s: float = 8.0
    # Sent with every request. A value "env:NAME" is read from the environment variable NAME
    # when each request is made, so a token never reaches .hydra/, logs, W&B or checkpoints:
    # +judger.headers.Authorization=env:JUDGE_TOKEN with JUDGE_TOKEN="Bearer ..." exported.
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.url.startswith(("http://", "https://")), "judger.url", self.url, "an http:// or https:// URL")
        for key in ("url", "batch_url"):
            refuse_url_credentials(f"judger.{key}", getattr(self, key))
        for name, value in self.headers.items():
            _check(bool(re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", str(name))), f"judger.headers.{name}", "...",
                   "a header name (letters, digits, -)")
            ref = str(value)[len(ENV_PREFIX):] if str(value).startswith(ENV_PREFIX) else None
            _check(ref is None or bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref)), f"judger.headers.{name}",
                   value, f"{ENV_PREFIX}<environment variable name> or a literal value")
            if ref is not None and ref not in os.environ:  # refused before the run starts, not at its first request
                raise ConfigError(f"judger.headers.{name}={value} is not allowed: the environment variable {ref} "
                                  f"is not set (export it before starting)")
            problem = header_value_problem(os.environ[ref] if ref is not None else str(value))
            if problem is not None:  # the HTTP client's error would quote the whole value into every log
                where = f"the environment variable {ref} holds" if ref is not None else "it is"
                raise ConfigError(f"judger.headers.{name}{'=' + str(value) if ref is not None else ''} is not allowed: "
                                  f"{where} no legal HTTP header value: {problem} (the value is not shown)")
        _check(self.batch_url is None or self.batch_url.startswith(("http://", "https://")), "judger.batch_url",
               self.batch_url, "null or an http:// or https:// URL")
        _check(self.timeout_s > 0, "judger.timeout_s", self.timeout_s, "> 0")
        _check(self.max_concurrent_requests >= 1, "judger.max_concurrent_requests", self.max_concurrent_requests,
               ">= 1")
        _check(self.max_retries >= 0, "judger.max_retries", self.max_retries, ">= 0")
        _check(self.backoff_s >= 0, "judger.backoff_s", self.backoff_s, ">= 0")
        _check(self.backoff_max_s >= self.backoff_s, "judger.backoff_max_s", self.backoff_max_s,
               f">= judger.backoff_s ({self.backoff_s})")


# ----------------------------------------------------------------------------- model
LORA_SYNCS = ("merged", "adapter")
DTYPES = ("float32", "bfloat16", "float16")
VLLM_MAX_LORA_RANK = 512  # the largest of vLLM's max_lora_rank values (vllm.config.lora.MaxLoRARanks)


MAX_LORA_SCALE = 1024  # alpha / rank beyond this multiplies the update into overflow, not a setting


@dataclass
class LoraConf:
    """LoRA adapters through peft (rlharness/model/lora.py); rank 0 trains every weight."""

    # Rank of the adapters; 0 = no LoRA (every weight trains).
    rank: int = 0
    alpha: float = 16.0  # the update is scaled by alpha / rank
    # > 0 makes the trainer's log-probs differ from the engine's (dropout is on only in training).
    dropout: float = 0.0
    # Module names (peft's suffix match); empty = the attention and MLP projections of a
    # Llama/Qwen2 layout that the model has (rlharness.model.lora.DEFAULT_TARGETS).
    target_modules: list[str] = field(default_factory=list)
    # What engines receive at a weight sync: `merged` (base + scale * B @ A for the adapted
    # matrices only) or `adapter` (the A and B matrices; the engine applies them).
    sync: str = "merged"

    def __post_init__(self) -> None:
        _check(isinstance(self.rank, int) and self.rank >= 0, "model.lora.rank", self.rank, "an integer >= 0")
        _check(self.alpha > 0 and self.alpha <= MAX_LORA_SCALE * max(self.rank, 1), "model.lora.alpha", self.alpha,
               f"> 0 and at most {MAX_LORA_SCALE} x model.lora.rank (the update is scaled by alpha / rank; "
               f"usual: 1-2 x rank)")
        _check(0 <= self.dropout < 1, "model.lora.dropout", self.dropout, "in [0, 1)")
        _one_of("model.lora.sync", self.sync, LORA_SYNCS)
        _check(all(isinstance(t, str) and t for t in self.target_modules), "model.lora.target_modules",
               self.target_modules, "a list of module names")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class ModelConf:
    # Any Hugging Face causal-LM directory; relative paths resolve against the project.
    path: str = "assets/tiny-arith"
    # Weights' dtype on the trainer, and on the engine unless engine_dtype says otherwise (the
    # on-policy guard checks runs whose trainer and engine are both float32).
    dtype: str = "float32"
    # The engine's weights' dtype when it differs from the trainer's (a float32 trainer feeding a
    # bfloat16 engine, as verl's FSDP+vLLM does); None = model.dtype. Syncs send this dtype.
    engine_dtype: Optional[str] = None
    # transformers' attention for the hf engine and the trainer: eager, sdpa, flex_attention (training or
    # decoding on a GPU only), flash_attention_2/3/4 (a GPU and the flash-attn package), a Hub kernel
    # (org/name) or one registered with transformers' AttentionInterface. Checked with the devices before
    # a run starts (rlharness/model/attention.py).
    attn_implementation: str = "eager"
    # Allow a model whose config maps to code of its own (auto_map); refused otherwise.
    trust_remote_code: bool = False
    lora: LoraConf = field(default_factory=LoraConf)

    def __post_init__(self) -> None:
        _one_of("model.dtype", self.dtype, DTYPES)
        if self.engine_dtype is not None:
            _one_of("model.engine_dtype", self.engine_dtype, DTYPES)

    @property
    def engine_weights_dtype(self) -> str:
        return self.engine_dtype or self.dtype

    @property
    def narrowest_dtype(self) -> str:
        """The less precise of the trainer's and the engine's dtypes: float32 only when both are."""
        return self.dtype if self.engine_weights_dtype == "float32" else self.engine_weights_dtype

    def for_engine(self) -> "ModelConf":
        """This model as an engine loads it (in the engine's dtype)."""
        return replace(self, dtype=self.engine_weights_dtype, engine_dtype=None)


# ----------------------------------------------------------------------------- engine
@dataclass
class EngineConf:
    name: str = MISSING
    # Rollout engines; requests are spread over them (mode=disagg: one Ray actor each).
    num_engines: int = 1
    # How new weights reach the engine, declared here so the route is chosen once when the
    # run is built (rlharness/weights/transfer.py `choose_route`): `auto` (mode=disagg: the Ray
    # object store, or an NCCL group when engines and trainers both hold GPUs), `collective`
    # (a broadcast group: NCCL between GPUs, gloo otherwise), `disk` (vllm only).
    weight_sync: str = "auto"
    # Delta syncs (rlharness/weights/delta.py): each sync sends only the values that changed since the
    # last one, in the engine's dtype. `auto` (resolved when the run's config is checked): on where the
    # engine's weights are narrower than float32 (a step changes a few percent of them) and the trainer's
    # are on a GPU (the difference is computed there; on a CPU computing it costs more time than the
    # bytes it saves: docs/benchmarks.md), never with model.lora.sync=adapter; `on`; `off`.
    weight_delta: str = "auto"

    def weight_sync_routes(self) -> tuple[str, ...]:
        """The `weight_sync` values this engine can serve."""
        return ("auto", "collective")

    def __post_init__(self) -> None:
        _check(self.num_engines >= 1, "engine.num_engines", self.num_engines, ">= 1")
        _one_of("engine.weight_sync", self.weight_sync, self.weight_sync_routes())
        _one_of("engine.weight_delta", self.weight_delta, ("auto", "on", "off"))

    def sends_deltas(self, model: ModelConf, trainer_on_gpu: bool = False) -> bool:
        """Whether syncs to this engine send differences (`weight_delta`, for these model settings)."""
        if self.weight_delta == "off" or (model.lora.enabled and model.lora.sync == "adapter"):
            return False
        return self.weight_delta == "on" or (model.engine_weights_dtype != "float32" and trainer_on_gpu)


@dataclass
class HFEngineConf(EngineConf):
    name: str = "hf"
    # Where the hf engine runs: cpu or cuda.
    device: str = "cpu"
    # Most sequences decoded together; waiting requests join as others finish.
    max_batch_size: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.max_batch_size >= 1, "engine.max_batch_size", self.max_batch_size, ">= 1")
        _check_device("engine.device", self.device)


@dataclass
class VLLMEngineConf(EngineConf):
    name: str = "vllm"
    # Share of the GPU's memory vLLM may take (weights and KV cache).
    gpu_memory_utilization: float = 0.5
    # GPUs per vLLM engine (tensor parallelism).
    tensor_parallel_size: int = 1
    # No CUDA graphs (faster start, slower decoding).
    enforce_eager: bool = True
    # How new weights reach vLLM's workers, colocated too: `collective` (broadcast in a
    # process group with the weights' holder: NCCL between GPUs, gloo otherwise) or `disk`
    # (a safetensors folder that vLLM reloads). See rlharness/engine/vllm.py.
    weight_sync: str = "collective"
    sync_timeout_s: float = 300.0  # every wait of a weight sync; past it the sync fails naming the engine
    # Colocated on one GPU: vLLM sleeps (weights offloaded, KV cache freed) while training runs. CUDA only.
    sleep_mode: bool = False
    cpu_kv_cache_gib: float = 1.0  # KV cache of vLLM's CPU build (its kv_cache_memory_bytes)
    # vLLM's CPU build, `weight_sync=collective`: `onednn` keeps vLLM's packed linear weights (re-packed
    # on every sync: the sync costs ~5x a broadcast); `torch` puts the linear layers on torch's F.linear
    # over plain weights at the first sync, each sync then loads in place (~1.3x a broadcast) but
    # decoding is ~2x slower (docs/benchmarks.md, "Trainer and weight-sync throughput").
    cpu_linear: str = "onednn"

    def weight_sync_routes(self) -> tuple[str, ...]:
        return ("collective", "disk")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.sync_timeout_s > 0, "engine.sync_timeout_s", self.sync_timeout_s, "> 0")
        _check(self.tensor_parallel_size >= 1, "engine.tensor_parallel_size", self.tensor_parallel_size, ">= 1")
        _check(0 < self.gpu_memory_utilization <= 1, "engine.gpu_memory_utilization",
               self.gpu_memory_utilization, "in (0, 1]")
        _check(self.cpu_kv_cache_gib > 0, "engine.cpu_kv_cache_gib", self.cpu_kv_cache_gib, "> 0")
        _one_of("engine.cpu_linear", self.cpu_linear, ("torch", "onednn"))


@dataclass
class SimEngineConf(EngineConf):
    name: str = "sim"
    # Response lengths ~ lognormal(mean, cv), capped at max_len (= agent max_tokens if 0).
    mean_response_len: float = 64.0
    # Coefficient of variation of the response lengths (0 = all the same length).
    cv: float = 1.0
    # Cap on a response's length; 0 = agent.sampling.max_tokens.
    max_len: int = 0
    # Simulated decode time per token of each request.
    time_per_token_s: float = 0.001
    # Simulated time before a request's first token.
    prefill_s: float = 0.0
    slots: int = 64  # concurrent requests per engine
    # Probability a sampled token is the right answer is irrelevant here: rewards come
    # from the judger on the text the sim engine emits (random tokens).

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.mean_response_len > 0, "engine.mean_response_len", self.mean_response_len, "> 0")
        _check(self.cv >= 0, "engine.cv", self.cv, ">= 0")
        _check(self.slots >= 1, "engine.slots", self.slots, ">= 1")
        _check(self.max_len >= 0, "engine.max_len", self.max_len, ">= 0 (0 = agent.sampling.max_tokens)")
        _check(self.time_per_token_s >= 0, "engine.time_per_token_s", self.time_per_token_s, ">= 0")
        _check(self.prefill_s >= 0, "engine.prefill_s", self.prefill_s, ">= 0")


# ----------------------------------------------------------------------------- backend
@dataclass
class BackendConf:
    name: str = MISSING

    @property
    def workers(self) -> int:
        """Training processes (ranks): one, except where the backend runs several (deepspeed, fsdp2)."""
        return 1

    @property
    def on_gpu(self) -> bool:
        """The trainer's weights live on a GPU (backends with a `device` say so)."""
        return False

    @property
    def ranked(self) -> bool:
        """The backend runs as ranks on Ray actors (deepspeed, fsdp2), whatever their number."""
        return self.name in ("deepspeed", "fsdp2")


def check_trainer_keys(conf: Any) -> None:
    """The keys every model-training backend shares (torch, fsdp2, deepspeed)."""
    _check_device("backend.device", conf.device)
    _check(conf.logprob_chunk_tokens >= 1, "backend.logprob_chunk_tokens", conf.logprob_chunk_tokens, ">= 1")
    _check(conf.micro_batch_tokens is None or conf.micro_batch_tokens >= 1, "backend.micro_batch_tokens",
           conf.micro_batch_tokens, ">= 1 (or null for algo.micro_batch_size rows per micro-batch)")


@dataclass
class TorchBackendConf(BackendConf):
    name: str = "torch"
    # Where the trainer runs: cpu or cuda.
    device: str = "cpu"
    # Recompute activations in the backward pass: less memory, more compute.
    gradient_checkpointing: bool = False
    # Response tokens whose vocabulary projection and log-softmax are computed at once
    # (rlharness/algo/logprobs.py): bounds the trainer's largest tensor to this x vocab floats.
    logprob_chunk_tokens: int = 1024
    # Token-budget micro-batches: rows grouped so each micro-batch holds at most this many tokens
    # (padded rows: longest first, padding included, rlharness/backend/micro_batches.py; packed rows:
    # the same, shorter samples moved into longer ones' padding, rlharness/backend/packing.py);
    # null: algo.micro_batch_size rows.
    micro_batch_tokens: Optional[int] = None
    # Packed rows (rlharness/backend/packing.py): a micro-batch's samples end to end, position ids
    # restarting per sample, no attention across them, for the policy, its reference and the critic.
    # null: on where the model's attention keeps packed samples apart (probed when the trainer starts),
    # else off (logged once); true: on, refused for a model whose attention does not; false: off.
    packing: Optional[bool] = None

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    def __post_init__(self) -> None:
        check_trainer_keys(self)


@dataclass
class DeepSpeedBackendConf(BackendConf):
    name: str = "deepspeed"
    # ZeRO stage: 0 (plain data parallel), 1 (optimizer states), 2 (+ gradients), 3 (+ weights).
    zero_stage: int = 2
    # Training ranks, each a Ray actor.
    num_workers: int = 2
    # Where the ranks train: cpu (gloo) or cuda (NCCL).
    device: str = "cpu"
    # As backend=torch's.
    gradient_checkpointing: bool = False
    logprob_chunk_tokens: int = 1024  # as backend=torch's
    micro_batch_tokens: Optional[int] = None  # as backend=torch's, within each rank's share
    packing: Optional[bool] = None  # as backend=torch's
    # Rows split across ranks by Karmarkar-Karp on their lengths, equal row counts
    # (rlharness/backend/rank_balance.py); false: rank r trains rows r, r + W, ...
    balance_ranks: bool = True

    on_gpu = TorchBackendConf.on_gpu

    def __post_init__(self) -> None:
        check_trainer_keys(self)
        _one_of("backend.zero_stage", self.zero_stage, (0, 1, 2, 3))
        _check(self.num_workers >= 1, "backend.num_workers", self.num_workers, ">= 1")

    @property
    def workers(self) -> int:
        return self.num_workers


@dataclass
class FSDP2BackendConf(TorchBackendConf):
    """torch's FSDP2 (`fully_shard` per transformer block and the root) across `num_workers` ranks on Ray
    actors (rlharness/backend/fsdp2_runner.py); the other keys are backend=torch's."""

    name: str = "fsdp2"
    # Training ranks, one Ray actor each (cluster.trainer_cpus apiece); each keeps 1/num_workers of every
    # parameter, gradient and optimizer state.
    num_workers: int = 2
    # Rows split across ranks by Karmarkar-Karp on their lengths, equal row counts
    # (rlharness/backend/rank_balance.py); false: rank r trains rows r, r + W, ...
    balance_ranks: bool = True
    # Free each block's gathered parameters after its forward (gathered again for its backward);
    # false keeps them until the backward: less communication, more memory.
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.num_workers >= 1, "backend.num_workers", self.num_workers, ">= 1")

    @property
    def workers(self) -> int:
        return self.num_workers


@dataclass
class SimBackendConf(BackendConf):
    name: str = "sim"
    # Simulated seconds per training step.
    step_time_s: float = 0.05
    # Simulated training seconds per trained token, on top of step_time_s.
    time_per_token_s: float = 0.0

    def __post_init__(self) -> None:
        _check(self.step_time_s >= 0, "backend.step_time_s", self.step_time_s, ">= 0")
        _check(self.time_per_token_s >= 0, "backend.time_per_token_s", self.time_per_token_s, ">= 0")


# ----------------------------------------------------------------------------- algo
# The algorithms by name: what algo.advantage and algo.policy_loss accept, and the pure function each
# names ("module:function", imported by rlharness.algo when used: this layer loads no torch). gae needs
# the critic's values: the backend computes it (rlharness/algo/gae.py).
ADVANTAGES: dict[str, str | None] = {
    "grpo": "rlharness.algo.advantages:grpo_advantages",
    "drgrpo": "rlharness.algo.advantages:drgrpo_advantages",
    "rloo": "rlharness.algo.advantages:rloo_advantages",
    "reinforce_pp": "rlharness.algo.advantages:reinforce_pp_advantages",
    "gae": None,
    # On-policy distillation: no reward advantage; the teacher's per-token signal alone (rlharness/algo/distill.py).
    "opd": None,
}
# The advantages whose baseline is not the group's mean (a group of one sample still learns).
NO_GROUP_BASELINE = ("gae", "opd")
POLICY_LOSSES: dict[str, str] = {
    "ppo": "rlharness.algo.losses:ppo_loss",
    "dual_clip": "rlharness.algo.losses:dual_clip_loss",
    "gspo": "rlharness.algo.losses:gspo_loss",
    "cispo": "rlharness.algo.losses:cispo_loss",
}


@dataclass
class CriticConf:
    """The value model of `algo.advantage=gae` (algo=ppo): rlharness/backend/critic.py."""

    # A causal-LM folder whose decoder becomes the critic's body (a fresh scalar value head on top);
    # None = model.path (the policy's starting checkpoint).
    path: Optional[str] = None
    # The critic's learning rate (constant).
    lr: float = 1e-4
    # The critic's AdamW weight decay.
    weight_decay: float = 0.0
    # Clip the critic's gradient norm to this (0 = off).
    grad_clip: float = 1.0
    # The value loss's clip: a new value may move at most this far from the step's old value before
    # its squared error stops shrinking (verl's critic.cliprange_value).
    cliprange_value: float = 0.5
    # The first warmup_steps training steps update only the critic (the policy waits for a baseline
    # that is better than random); the policy's LR schedule still counts them.
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        _check(self.lr > 0, "algo.critic.lr", self.lr, "> 0")
        _check(self.weight_decay >= 0, "algo.critic.weight_decay", self.weight_decay, ">= 0")
        _check(self.grad_clip >= 0, "algo.critic.grad_clip", self.grad_clip, ">= 0 (0 disables)")
        _check(self.cliprange_value > 0, "algo.critic.cliprange_value", self.cliprange_value, "> 0")
        _check(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "algo.critic.warmup_steps",
               self.warmup_steps, "an integer >= 0")


TEACHER_DTYPES = ("float32", "bfloat16")


@dataclass
class TeacherConf:
    """On-policy distillation's teacher (rlharness/teacher/): a frozen causal LM that scores the student's
    sampled tokens, never generates. Per response token t, reverse_kl_t = log pi_student(t) - log
    pi_teacher(t) (the engine's sampled log-prob minus the teacher's, both at the sampling temperature);
    `coef` x -reverse_kl_t is added to the token's advantage (algo=opd: it is the whole advantage)."""

    # The teacher's folder: any causal-LM checkpoint whose tokenizer gives the student's token ids
    # (checked at start); null = no teacher. Relative paths as model.path. Fixed for a run (resume).
    path: Optional[str] = None
    # Weight of the distillation term in the advantage: advantage_t += -coef x reverse_kl_t (>= 0).
    coef: float = 1.0
    # The teacher's weights' dtype (float32 or bfloat16: half the memory).
    dtype: str = "float32"
    # Where the teacher's forward passes run: cpu or cuda (a device of its own: cuda:1).
    device: str = "cpu"
    # transformers' attention implementation for the teacher (as model.attn_implementation's; a teacher never
    # decodes or trains, so flex_attention also runs on a CPU).
    attn_implementation: str = "eager"
    # Allow a teacher whose config maps to code of its own (auto_map); refused otherwise.
    trust_remote_code: bool = False
    # Rows per teacher forward pass; groups that finish while one runs wait and go together.
    batch_rows: int = 16
    # Response tokens projected onto the vocabulary at once (as backend.logprob_chunk_tokens).
    logprob_chunk_tokens: int = 1024
    # Seconds a scoring call may take; past it the groups in it fail (counted, re-sampled), the run goes on.
    timeout_s: float = 600.0
    # mode=disagg: CPUs reserved for the teacher's Ray actor (its own placement group; GPU 1 when
    # device is cuda). 0 with a CPU device = no reservation (the actor shares the node's cores).
    num_cpus: float = 0.0
    # torch threads of the teacher's actor (mode=disagg; colocated it shares the trainer's process).
    torch_threads: int = 1

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def check(self, key: str) -> None:
        """Refuse a value that cannot work; `key` is where this conf sits (algo.teacher, tasks.<name>.teacher).
        Here and not in __post_init__, which would not know the key."""
        _check(self.coef >= 0, f"{key}.coef", self.coef, ">= 0")
        _one_of(f"{key}.dtype", self.dtype, TEACHER_DTYPES)
        _check_device(f"{key}.device", self.device)
        _check(self.batch_rows >= 1, f"{key}.batch_rows", self.batch_rows, ">= 1")
        _check(self.logprob_chunk_tokens >= 1, f"{key}.logprob_chunk_tokens", self.logprob_chunk_tokens, ">= 1")
        _check(self.timeout_s > 0, f"{key}.timeout_s", self.timeout_s, "> 0")
        _check(self.num_cpus >= 0, f"{key}.num_cpus", self.num_cpus, ">= 0")
        _check(self.torch_threads >= 1, f"{key}.torch_threads", self.torch_threads, ">= 1")

    def model_conf(self) -> ModelConf:
        """The teacher as a model to load (no LoRA: it is frozen)."""
        return ModelConf(path=self.path or "", dtype=self.dtype, attn_implementation=self.attn_implementation,
                         trust_remote_code=self.trust_remote_code)


@dataclass
class AlgoConf:
    name: str = MISSING
    # grpo | drgrpo | rloo | reinforce_pp (= verl's reinforce_plus_plus_baseline): a group
    # baseline, so they need sampler.prompt_repeat_k >= 2. gae: per-token GAE against a learned
    # critic (algo=ppo; `critic`, `gamma`, `lam`, `kl_reward_coef` below; rlharness/algo/gae.py).
    # opd: on-policy distillation, the teacher's per-token signal alone (algo=opd; `teacher` below).
    advantage: str = "grpo"
    # Divide a group's advantages by its reward std (GRPO); off: Dr.GRPO's unscaled advantages.
    norm_adv_by_std: bool = True
    # GAE's discount and lambda (verl's algorithm.gamma / lam; lam=1: Monte-Carlo returns - values).
    gamma: float = 1.0
    # GAE's lambda (1: Monte-Carlo returns minus values).
    lam: float = 1.0
    # gae only: -kl_reward_coef x (old - reference log-prob) added to every response token's reward
    # (verl's use_kl_in_reward with a fixed kl_ctrl.kl_coef); 0 = off. Loads the reference model.
    kl_reward_coef: float = 0.0
    critic: CriticConf = field(default_factory=CriticConf)
    # On-policy distillation: a teacher scoring every sampled token (path null = none); algo=opd uses it
    # alone, any other group advantage adds -teacher.coef x reverse KL per token to its own.
    teacher: TeacherConf = field(default_factory=TeacherConf)
    # ppo (clipped) | dual_clip (+ cap -clip_ratio_c * A for A < 0) | gspo (sequence ratio;
    # needs loss_agg=seq_mean_token_mean) | cispo (clipped ratio as a detached weight).
    # Formulas: rlharness/algo/losses.py.
    policy_loss: str = "ppo"
    # Loss aggregation: token_mean (DAPO), seq_mean_token_mean (GRPO paper),
    # seq_mean_token_sum_norm (Dr.GRPO: token sum / max_tokens).
    loss_agg: str = "token_mean"
    # The ratio's clip range is [1 - clip_eps_low, 1 + clip_eps_high] (DAPO's clip-higher: raise high).
    clip_eps_low: float = 0.2
    # The upper half of the clip range.
    clip_eps_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual_clip's bound (> 1), verl's default
    # Weight of the KL-to-reference term in the loss; > 0 loads a frozen reference model.
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # k1 | k3
    kl_clamp: float = 0.0  # caps k3 per token (verl uses 10); 0 = off
    # Weight of the entropy bonus (subtracted from the loss).
    entropy_coef: float = 0.0
    # Off-policy correction between the engine's (rollout) and the trainer's log-probs:
    # truncated importance sampling min(rho, tis_cap), rho per token or per sequence; 0 disables.
    tis_cap: float = 2.0
    tis_level: str = "token"  # token | sequence
    # Rejection: tokens (or whole sequences) whose rho leaves [rejection_low, rejection_high]
    # get no loss. none | token | sequence (TRL's default is a sequence mask).
    rejection: str = "none"
    rejection_low: float = 0.0  # 0 = no lower bound
    # Upper bound of the ratio rejection keeps.
    rejection_high: float = 3.0
    # DAPO overlong shaping: penalty up to -overlong_penalty_factor over the last
    # overlong_buffer_len tokens of the budget (0 = off); mask_truncated: responses cut
    # by the budget get no loss.
    overlong_buffer_len: int = 0
    # The largest overlong penalty (at the budget's last token).
    overlong_penalty_factor: float = 1.0
    # Give no loss to responses cut by the token budget.
    mask_truncated: bool = False
    # A member that failed for a reason that is not the policy's (its agent program crashed, hung or
    # never called the model; a tool sandbox could not start; the judger ran past its limits on it):
    # mask: left out of its group's advantage statistics and of the loss (a group left with fewer than
    # two valid members is FAILED); zero: scored 0 and trained; drop_group: its whole group FAILED.
    # rlharness/core/member_failures.py.
    failed_member_policy: str = "mask"
    # The on-policy guard: in a step where every trained token was sampled by the weights being
    # trained (version step - 1), the engine's and the trainer's log-probs differ by rounding
    # only (mean |diff| per token, float32: tiny model 400 steps median 4.5e-7, max 6.2e-7;
    # SmolLM2-135M 11 steps 3.5e-6 to 3.8e-6); a step whose mean gap `train/logprob_diff_rollout`
    # exceeds this logs a warning naming the step, the groups and the gap (an engine computing
    # on other weights or state: 1e-4 and more). 0 = off. Raise it for a model whose rounding
    # gap is larger.
    onpolicy_logprob_gap_warn: float = 2e-5
    # Decoupled PPO objective (AReaL): the proximal policy the clip is taken against, the
    # behaviour/proximal ratio weighted by the truncated importance weight above.
    # recompute: the weights at the start of the step (exact; free with one update per step,
    # one no-grad forward otherwise); loglinear: AReaL's approximation from the tokens'
    # versions (no extra forward); behaviour: the rollout policy (the coupled objective).
    proximal: str = "recompute"
    # The policy's peak learning rate (AdamW).
    lr: float = 3e-4
    # AdamW's weight decay.
    weight_decay: float = 0.0
    # AdamW's beta1.
    adam_beta1: float = 0.9
    # AdamW's beta2.
    adam_beta2: float = 0.99
    # Clip the policy's gradient norm to this (0 = off).
    grad_clip: float = 1.0
    lr_schedule: str = "cosine"  # constant | cosine | linear (decays to min_lr_ratio at total_steps)
    # Steps of linear LR warm-up from 0.
    warmup_steps: int = 0
    # The LR schedule's floor, as a share of lr.
    min_lr_ratio: float = 0.1
    # Passes over each batch (each pass takes mini_batches optimizer steps).
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer steps per training step (per epoch)
    micro_batch_size: int = 512  # samples per forward/backward (gradient accumulation)

    def __post_init__(self) -> None:
        _one_of("algo.advantage", self.advantage, tuple(ADVANTAGES))
        _one_of("algo.policy_loss", self.policy_loss, tuple(POLICY_LOSSES))
        _one_of("algo.loss_agg", self.loss_agg,
                ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"))
        if self.policy_loss == "gspo" and self.loss_agg != "seq_mean_token_mean":
            raise ConfigError(
                f"algo.policy_loss=gspo with algo.loss_agg={self.loss_agg!r} is not allowed: GSPO's objective is "
                f"a mean over sequences; set algo.loss_agg=seq_mean_token_mean (or use algo=gspo)")
        _one_of("algo.kl_estimator", self.kl_estimator, ("k1", "k3"))
        _one_of("algo.failed_member_policy", self.failed_member_policy, FAILED_MEMBER_POLICIES)
        _one_of("algo.proximal", self.proximal, ("recompute", "loglinear", "behaviour"))
        _one_of("algo.lr_schedule", self.lr_schedule, ("constant", "cosine", "linear"))
        _one_of("algo.tis_level", self.tis_level, ("token", "sequence"))
        _one_of("algo.rejection", self.rejection, ("none", "token", "sequence"))
        _check(self.lr > 0, "algo.lr", self.lr, "> 0")
        _check(self.weight_decay >= 0, "algo.weight_decay", self.weight_decay, ">= 0")
        # torch's AdamW raises on betas outside [0, 1) only at its first step, after the run started.
        for key in ("adam_beta1", "adam_beta2"):
            _check(0 <= getattr(self, key) < 1, f"algo.{key}", getattr(self, key), "0 <= beta < 1")
        # The schedule's floor as a share of algo.lr: below 0 the LR turns negative (gradient ascent).
        _check(0 <= self.min_lr_ratio <= 1, "algo.min_lr_ratio", self.min_lr_ratio, "0 <= ratio <= 1")
        _check(self.warmup_steps >= 0, "algo.warmup_steps", self.warmup_steps, ">= 0 (0 = no warmup)")
        # The ratio's clip range is [1 - clip_eps_low, 1 + clip_eps_high] (clip_eps_low >= 1: no lower bound,
        # as CISPO may want).
        _check(self.clip_eps_low > 0, "algo.clip_eps_low", self.clip_eps_low, "> 0")
        _check(self.clip_eps_high > 0, "algo.clip_eps_high", self.clip_eps_high, "> 0")
        _check(self.clip_ratio_c > 1, "algo.clip_ratio_c", self.clip_ratio_c, "> 1")
        _check(self.kl_coef >= 0, "algo.kl_coef", self.kl_coef, ">= 0")
        _check(self.kl_clamp >= 0, "algo.kl_clamp", self.kl_clamp, ">= 0 (0 = off)")
        # The loss subtracts entropy_coef x entropy (a bonus); a negative coefficient would reward collapsing
        # the distribution, which rlharness does not apply (it would be silently ignored).
        _check(self.entropy_coef >= 0, "algo.entropy_coef", self.entropy_coef,
               ">= 0 (an entropy bonus; entropy minimisation is not supported)")
        # A cap below 1 would down-weight even on-policy tokens (rho = 1), shrinking the whole loss.
        _check(self.tis_cap == 0 or self.tis_cap >= 1, "algo.tis_cap", self.tis_cap,
               "0 (disables truncated importance sampling) or >= 1")
        _check(0 <= self.rejection_low < 1, "algo.rejection_low", self.rejection_low, "0 <= low < 1")
        _check(self.rejection_high > 1, "algo.rejection_high", self.rejection_high, "> 1")
        _check(self.overlong_buffer_len >= 0, "algo.overlong_buffer_len", self.overlong_buffer_len, ">= 0 (0 = off)")
        _check(self.overlong_penalty_factor >= 0, "algo.overlong_penalty_factor", self.overlong_penalty_factor,
               ">= 0")
        _check(self.onpolicy_logprob_gap_warn >= 0, "algo.onpolicy_logprob_gap_warn", self.onpolicy_logprob_gap_warn,
               ">= 0 (0 = off)")
        _check(self.grad_clip >= 0, "algo.grad_clip", self.grad_clip, ">= 0 (0 disables)")
        _check(self.ppo_epochs >= 1, "algo.ppo_epochs", self.ppo_epochs, ">= 1")
        _check(self.mini_batches >= 1, "algo.mini_batches", self.mini_batches, ">= 1")
        _check(self.micro_batch_size >= 1, "algo.micro_batch_size", self.micro_batch_size, ">= 1")
        _check(0 <= self.gamma <= 1, "algo.gamma", self.gamma, "0 <= gamma <= 1")
        _check(0 <= self.lam <= 1, "algo.lam", self.lam, "0 <= lam <= 1")
        _check(self.kl_reward_coef >= 0, "algo.kl_reward_coef", self.kl_reward_coef, ">= 0 (0 = off)")
        if self.kl_reward_coef > 0 and self.advantage != "gae":
            raise ConfigError(f"algo.kl_reward_coef={self.kl_reward_coef} is not allowed with algo.advantage="
                              f"{self.advantage}: the KL reward is per token and only GAE uses token rewards; "
                              f"use algo.kl_coef (a KL loss) instead")


# ----------------------------------------------------------------------------- task
# Rows a generated task (arithmetic, countdown, reasoning_gym) makes at the start: more than any run here
# consumes (400 steps x 64 prompts is 25,600), and about what fits in memory as prompts.
MAX_TASK_ROWS = 10_000_000


@dataclass
class TaskConf:
    name: str = MISSING
    seed: int = 1234  # data generation / split seed (not the run seed)
    # Held-out prompts (never trained on); eval.num_prompts of them are evaluated.
    num_eval: int = 200
    default_judger: str = "math"  # used when judger=auto (the default)
    # Longest prompt in tokens; 0 = the model's positions minus the response budget
    # (agent.sampling.max_tokens; eval.max_tokens for eval). Checked when the data loads.
    max_prompt_tokens: int = 0
    # What to do with longer prompts: refuse (stop before starting, naming the first) | drop.
    long_prompts: str = "refuse"

    def __post_init__(self) -> None:
        _check(isinstance(self.seed, int) and self.seed >= 0, "task.seed", self.seed, "an integer >= 0")
        _check(0 <= self.num_eval <= MAX_TASK_ROWS, "task.num_eval", self.num_eval, f"0..{MAX_TASK_ROWS}")
        _check(self.max_prompt_tokens >= 0, "task.max_prompt_tokens", self.max_prompt_tokens,
               ">= 0 (0 = the model's positions minus the response budget)")
        _one_of("task.long_prompts", self.long_prompts, ("refuse", "drop"))


@dataclass
class ArithmeticTaskConf(TaskConf):
    name: str = "arithmetic"
    # Digits per operand.
    digits: int = 3
    # Operators drawn from (+, -, *).
    operators: list[str] = field(default_factory=lambda: ["+"])
    # Training problems (all distinct, none in the eval split).
    num_train: int = 20000
    # Leading zeros make every operand exactly `digits` long ("042+917=").
    zero_pad: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(1 <= self.digits <= 9, "task.digits", self.digits, "1..9")
        for op in self.operators:
            _one_of("task.operators[]", op, ("+", "-", "*"))
        _check(len(self.operators) >= 1 and len(set(self.operators)) == len(self.operators), "task.operators",
               list(self.operators), "one or more distinct operators among +, -, *")
        _check(1 <= self.num_train <= MAX_TASK_ROWS, "task.num_train", self.num_train,
               f"1..{MAX_TASK_ROWS} (rows generated at the start)")
        # Problems are drawn without repeats; more than exist could never be drawn (the draw would not end).
        space = 10 ** (2 * self.digits) * len(self.operators)
        if self.num_train + self.num_eval > space:
            raise ConfigError(
                f"task.num_train + task.num_eval = {self.num_train + self.num_eval} is not allowed with "
                f"task.digits={self.digits} and task.operators={list(self.operators)}: there are only {space} distinct "
                f"problems; raise task.digits or lower task.num_train/num_eval")


@dataclass
class CountdownTaskConf(TaskConf):
    name: str = "countdown"
    # The countdown judger checks the expression and its numbers.
    default_judger: str = "countdown"
    # Numbers given per problem.
    num_numbers: int = 3
    # The largest number given.
    max_number: int = 20
    # Training problems.
    num_train: int = 20000

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(2 <= self.num_numbers <= 6, "task.num_numbers", self.num_numbers, "2..6")
        _check(self.max_number >= 1, "task.max_number", self.max_number, ">= 1")
        _check(1 <= self.num_train <= MAX_TASK_ROWS, "task.num_train", self.num_train,
               f"1..{MAX_TASK_ROWS} (rows generated at the start)")


@dataclass
class JsonlTaskConf(TaskConf):
    name: str = "jsonl"
    # JSONL or Parquet training file, or a glob pattern of such files (`data/train-*.parquet`, read in name order).
    path: str = MISSING
    # Held-out file (or pattern); else the last num_eval rows of path.
    eval_path: Optional[str] = None
    # The row's field holding the question.
    prompt_field: str = "question"
    # The row's field holding the answer.
    answer_field: str = "answer"
    # Python format string of the prompt; row fields by name ({question}, ...).
    prompt_template: str = "{question}"
    # GSM8K keeps the final answer after '####'; other layouts use the whole field.
    answer_delimiter: str = "####"
    # None: wrap the prompt in the model's chat template when its tokenizer has one; true: the
    # prompt must be (a model without a template is refused); false: plain text.
    apply_chat_template: Optional[bool] = None

    def __post_init__(self) -> None:
        super().__post_init__()


@dataclass
class ReasoningGymTaskConf(TaskConf):
    """One reasoning-gym dataset (rlharness/data/reasoning_gym.py); scored by its own `score_answer`."""

    name: str = "reasoning_gym"
    # Scored by the dataset's own score_answer.
    default_judger: str = "reasoning_gym"
    dataset: str = "basic_arithmetic"  # a reasoning-gym registry name: basic_arithmetic, chain_sum, ...
    # Keyword arguments of reasoning_gym.create_dataset (the dataset's config dataclass fields,
    # but seed and size, which come from task.seed and the split sizes).
    dataset_config: dict[str, Any] = field(default_factory=dict)
    # Training items (eval items are distinct and never in train).
    num_train: int = 20000
    # Appended to the question after a space (what the model must write, e.g. "Give only the final number.").
    instruction: str = ""
    # Wrap the question in the model's chat template.
    apply_chat_template: bool = True
    # Before the run a few items are generated in a process of their own, under this time (and 4 GB): a
    # dataset_config whose sizes make one item take minutes (max_terms: 1e8) is refused, not run for hours.
    probe_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.num_eval >= 0, "task.num_eval", self.num_eval, ">= 0")
        _check(1 <= self.num_train <= MAX_TASK_ROWS, "task.num_train", self.num_train,
               f"1..{MAX_TASK_ROWS} (rows generated at the start)")
        _check(self.probe_timeout_s > 0, "task.probe_timeout_s", self.probe_timeout_s, "> 0")
        # The dataset name and config keys are checked by RunConf, which knows the task's key.


# ----------------------------------------------------------------------------- tasks (multi-task)
TASK_NAME_CHARS = "letters, digits, '_' and '-'"


@dataclass
class TaskEntryConf:
    """One named task of a multi-task run (`tasks.<name>`); its name is its key.

    Each part defaults to the run's: `judger` to the task's own (`auto`), `agent` to
    the run's `agent`; `sampling` changes single keys of that agent's sampling (the
    temperature must stay the run's: the trainer scores log-probs at one temperature).
    """

    task: TaskConf = MISSING
    # This task's share of every batch (weights are normalised over the tasks).
    weight: float = 1.0
    judger: Optional[JudgerConf] = None  # None = auto: the task's own judger
    agent: Optional[AgentConf] = None
    # Sampling keys that differ from the agent's (`+tasks.<name>.sampling.max_tokens=12`).
    sampling: dict[str, Any] = field(default_factory=dict)
    # None = sampler.allow_epoch_rollover. False: once its data run out the task leaves
    # the mix and the others share its weight (a log line says when).
    allow_epoch_rollover: Optional[bool] = None
    # None = strategy.over_sample_threshold (async only).
    over_sample_threshold: Optional[float] = None
    # This task's distillation teacher, used when its path is set (`tasks.<name>.teacher.path=...`; its
    # other keys are then its own); path null = the run's algo.teacher, whole.
    teacher: TeacherConf = field(default_factory=TeacherConf)
    # None = the run's max_staleness, which is the largest a task may have: a task whose
    # rewards suffer from stale samples gets a tighter bound, held as the run's is
    # (strategy.staleness_mode: expiry of its tokens, or its admission budget).
    max_staleness: Optional[int] = None
    # Checked by RunConf, which knows the entry's name.


# ----------------------------------------------------------------------------- cluster
@dataclass
class ClusterConf:
    name: str = MISSING


@dataclass
class LocalClusterConf(ClusterConf):
    name: str = "local"


@dataclass
class LocalRayClusterConf(ClusterConf):
    name: str = "local_ray"
    # CPUs of the local Ray instance.
    num_cpus: int = 2
    # Ray's object store (weights travel through it in mode=disagg); 0 = Ray's default.
    object_store_memory_mb: int = 512
    # CPUs for each engine actor and each training actor (fractions allowed).
    engine_cpus: float = 1.0
    # CPUs for each training actor (fractions allowed).
    trainer_cpus: float = 1.0
    # Ray's session files; "" = a short per-process dir under the system temp dir.
    temp_dir: str = ""

    def __post_init__(self) -> None:
        _check(self.num_cpus >= 1, "cluster.num_cpus", self.num_cpus, ">= 1")
        _check(self.object_store_memory_mb >= 0, "cluster.object_store_memory_mb", self.object_store_memory_mb,
               ">= 0")
        _check(self.engine_cpus > 0, "cluster.engine_cpus", self.engine_cpus, "> 0")
        _check(self.trainer_cpus > 0, "cluster.trainer_cpus", self.trainer_cpus, "> 0")


@dataclass
class SlurmClusterConf(ClusterConf):
    name: str = "slurm"
    # Slurm partition (null: the cluster's default).
    partition: Optional[str] = None
    # Slurm account to charge (null: yours).
    account: Optional[str] = None
    # Slurm quality of service (null: the default).
    qos: Optional[str] = None
    # Nodes per job (mode=disagg spreads engines and trainers over them; see engine_nodes).
    nodes: int = 1
    # GPUs to request on each node.
    gpus_per_node: int = 0
    # CPUs per node (one task per node); threads follow it.
    cpus_per_task: int = 2
    # Memory per node in GB.
    mem_gb: int = 8
    # The job's time limit in minutes; at its end the job is requeued and resumes.
    timeout_min: int = 60
    # Slurm --constraint (node features).
    constraint: Optional[str] = None
    # Shell lines run in the job before the run (module load, env activation).
    setup: list[str] = field(default_factory=list)
    max_num_timeout: int = 3  # requeues on preemption/timeout
    # A job that reads as failed but is being requeued (preemption, timeout) reads PENDING
    # again within this time; only a failure read for this long ends the sweep's wait
    # (rlharness/launch/submitit_requeue.py).
    requeue_grace_s: float = 120.0
    # Multi-node Ray (rlharness.cluster.ray_cluster): the head's GCS port; 0 = derived
    # from the job id so jobs sharing a node do not collide.
    ray_port: int = 0
    # How long the head waits for every node to join, and a worker for the head.
    ray_timeout_s: float = 300.0
    # Ray's object store on each node; 0 = Ray's default (30% of the node's memory).
    object_store_memory_mb: int = 0
    # Logical CPUs per engine actor and per training actor (fractions allowed).
    engine_cpus: float = 1.0
    # Logical CPUs per training actor (fractions allowed).
    trainer_cpus: float = 1.0
    # mode=disagg on several nodes: the last `engine_nodes` nodes host the engine actors,
    # the others the training actors (node 0 also runs the driver). 0 = auto: enough
    # nodes for the engines' GPUs (at least one), the rest train. One node: all share it.
    engine_nodes: int = 0

    def __post_init__(self) -> None:
        _check(self.nodes >= 1, "cluster.nodes", self.nodes, ">= 1")
        _check(self.requeue_grace_s >= 0, "cluster.requeue_grace_s", self.requeue_grace_s, ">= 0")
        _check(self.mem_gb >= 1, "cluster.mem_gb", self.mem_gb, ">= 1")
        _check(self.timeout_min >= 1, "cluster.timeout_min", self.timeout_min, ">= 1")
        _check(self.max_num_timeout >= 0, "cluster.max_num_timeout", self.max_num_timeout, ">= 0")
        _check(0 <= self.ray_port <= 65535, "cluster.ray_port", self.ray_port, "0 (derived from the job id) or a port")
        _check(self.ray_timeout_s > 0, "cluster.ray_timeout_s", self.ray_timeout_s, "> 0")
        _check(self.cpus_per_task >= 1, "cluster.cpus_per_task", self.cpus_per_task, ">= 1")
        _check(self.gpus_per_node >= 0, "cluster.gpus_per_node", self.gpus_per_node, ">= 0")
        _check(self.object_store_memory_mb >= 0, "cluster.object_store_memory_mb", self.object_store_memory_mb,
               ">= 0 (0 = Ray's default)")
        _check(self.engine_cpus > 0, "cluster.engine_cpus", self.engine_cpus, "> 0")
        _check(self.trainer_cpus > 0, "cluster.trainer_cpus", self.trainer_cpus, "> 0")
        _check(self.engine_nodes == 0 or 1 <= self.engine_nodes < self.nodes, "cluster.engine_nodes",
               self.engine_nodes, f"0 (auto) or 1..{self.nodes - 1} (cluster.nodes - 1: a node must stay "
               f"for training)")


# ----------------------------------------------------------------------------- logger
@dataclass
class LoggerConf:
    name: str = MISSING


@dataclass
class WandbLoggerConf(LoggerConf):
    name: str = "wandb"
    # W&B project.
    project: str = "rlharness"
    # W&B entity (team or user; null: your default).
    entity: Optional[str] = None
    mode: str = "offline"  # offline | online | disabled
    # online: how long the start waits for the W&B server; past it (or with no connection to it at all) the run
    # logs offline (`wandb sync` later).
    init_timeout_s: float = 90.0
    # W&B run tags.
    tags: list[str] = field(default_factory=list)
    # W&B run name; null: `<date>/<time>` of the run directory, a sweep's job `<sweep date>/<time>#<n> <its
    # point of the sweep>` (e.g. `2026-11-29/02-10-00#1 strategy=async`).
    run_name: Optional[str] = None
    # W&B group; null: a sweep's jobs are grouped by their sweep, a single run has none.
    group: Optional[str] = None
    # A wandb.Table of the step's samples every this many steps (0 = never); every eval also
    # logs a table of its completions. Each table holds at most max_sample_rows rows, whole
    # groups (whole prompts for eval) only.
    log_samples_every: int = 10
    # The most rows a samples table holds.
    max_sample_rows: int = 64

    def __post_init__(self) -> None:
        _one_of("logger.mode", self.mode, ("offline", "online", "disabled"))
        _check(self.init_timeout_s > 0, "logger.init_timeout_s", self.init_timeout_s, "> 0")
        _check(self.log_samples_every >= 0, "logger.log_samples_every", self.log_samples_every, ">= 0 (0 = never)")
        _check(self.max_sample_rows >= 1, "logger.max_sample_rows", self.max_sample_rows, ">= 1")


@dataclass
class NoneLoggerConf(LoggerConf):
    name: str = "none"


# ----------------------------------------------------------------------------- eval
@dataclass
class EvalConf:
    num_prompts: int = 200  # prompts from the eval split (<= task.num_eval)
    # n samples per prompt at `temperature` (0 = pass_k): eval/avg@n (mean accuracy of the samples)
    # and the unbiased eval/pass@k from n >= k samples (Chen et al. 2021). eval/accuracy stays greedy.
    num_samples: int = 0
    # k of eval/pass@k; above 1 the eval samples eval.num_samples per prompt (k when that is 0).
    pass_k: int = 1
    temperature: float = 1.0  # for the n samples; eval/accuracy is greedy
    max_tokens: int = 0  # 0 = agent.sampling.max_tokens
    # evaluate.py resume=<run dir>: the checkpoint to evaluate (null = the newest complete one).
    checkpoint_step: Optional[int] = None

    def __post_init__(self) -> None:
        _check(self.num_prompts >= 1, "eval.num_prompts", self.num_prompts, ">= 1")
        _check(self.temperature >= 0, "eval.temperature", self.temperature, ">= 0")
        _check(self.max_tokens >= 0, "eval.max_tokens", self.max_tokens, ">= 0 (0 = agent.sampling.max_tokens)")
        _check(self.pass_k >= 1, "eval.pass_k", self.pass_k, ">= 1")
        _check(self.num_samples == 0 or self.num_samples >= self.pass_k, "eval.num_samples", self.num_samples,
               f"0 (= pass_k) or >= eval.pass_k={self.pass_k} (pass@k needs n >= k samples)")

    @property
    def n(self) -> int:
        """Samples per prompt for avg@n and pass@k (1 = no sampled eval)."""
        return self.num_samples or self.pass_k


# ----------------------------------------------------------------------------- trainer
@dataclass
class TrainerConf:
    # A step whose loss or gradient is non-finite is skipped (the weights stay as they were) and
    # counted (train/nonfinite_steps); this many in a row stop the run, naming the step and the
    # likely cause (the last checkpoint is kept; none is written from non-finite weights).
    max_nonfinite_steps: int = 3
    # Step 0 trains once on a synthetic batch at the longest prompt and response the config allows
    # (one micro-batch, no weight or optimizer state kept), before any data is consumed: an
    # out-of-memory happens at start, naming the settings to lower. null = on for real models
    # (rlharness/trainer/probe.py: at least PROBE_AUTO_MIN_PARAMS parameters), off for the embedded ones.
    probe_longest: Optional[bool] = None

    def __post_init__(self) -> None:
        _check(self.max_nonfinite_steps >= 1, "trainer.max_nonfinite_steps", self.max_nonfinite_steps, ">= 1")


# ----------------------------------------------------------------------------- health
ON_ALARM = ("warn", "stop")


@dataclass
class MonitorConf:
    """What every health monitor's section (`health.<section>`) has: its action when it fires."""

    section: ClassVar[str] = ""
    # What the run does when this monitor fires: warn | stop | null (health.on_alarm, the run's).
    on_alarm: Optional[str] = None

    def _check_key(self, ok: bool, key: str, allowed: str) -> None:
        """`_check` of this section's `key` (the message names health.<section>.<key> and its value)."""
        _check(ok, f"health.{self.section}.{key}", getattr(self, key), allowed)

    def __post_init__(self) -> None:
        self._check_key(self.on_alarm is None or self.on_alarm in ON_ALARM, "on_alarm",
                        "null (health.on_alarm), warn or stop")


def _steps(value: Any, least: int) -> bool:
    return isinstance(value, int) and value >= least


@dataclass
class RewardHackingConf(MonitorConf):
    """A trained reward that rises while an independent score falls (rlharness/health/reward_hacking.py).

    Independent scores: `eval/accuracy` when the trained reward is not the eval's judger (a learned
    or LLM judge), and the parts of a router judger (`rollout/reward_<part>_mean`)."""

    section: ClassVar[str] = "reward_hacking"
    # The independent score fell this many standard errors below its best earlier value ...
    drop_z: float = 3.0
    # ... and by at least this much (absolute, in the score's units) ...
    min_drop: float = 0.05
    # ... while the trained reward's slope over the same steps is this many standard errors above 0.
    rise_t: float = 2.0
    # Router parts: one part's slope this many standard errors above 0 while another's is as far below ...
    part_t: float = 3.0
    # ... over this many steps.
    window_steps: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(self.drop_z > 0, "drop_z", "> 0")
        self._check_key(self.min_drop >= 0, "min_drop", ">= 0")
        self._check_key(self.rise_t > 0, "rise_t", "> 0")
        self._check_key(self.part_t > 0, "part_t", "> 0")
        self._check_key(_steps(self.window_steps, 3), "window_steps", "an integer >= 3")


@dataclass
class EntropyCollapseConf(MonitorConf):
    """`train/entropy` collapsing while the trained reward does not rise (rlharness/health/policy.py)."""

    section: ClassVar[str] = "entropy_collapse"
    # Alarm when the entropy's mean over the last `window_steps` is below this share of its mean over the first ...
    min_ratio: float = 0.2
    # ... and the reward rose less than this many standard deviations of the first steps' sampled rewards
    # (a policy that narrows onto answers that score is converging, not collapsing).
    min_reward_gain: float = 0.5
    # Steps in each mean.
    window_steps: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(0 < self.min_ratio < 1, "min_ratio", "0 < ratio < 1")
        self._check_key(self.min_reward_gain >= 0, "min_reward_gain", ">= 0")
        self._check_key(_steps(self.window_steps, 1), "window_steps", "an integer >= 1")


@dataclass
class KLAccelerationConf(MonitorConf):
    """`train/kl` (a KL term: algo.kl_coef > 0) growing faster and faster, over three windows of steps
    (rlharness/health/policy.py)."""

    section: ClassVar[str] = "kl_acceleration"
    # The last window's growth of the KL is at least this many times the growth before it ...
    ratio: float = 3.0
    # ... and at least this many times the KL before it (1: the KL doubled) ...
    min_growth: float = 1.0
    # ... the KL is above this ...
    min_kl: float = 0.05
    # ... and the growth is this many standard errors sure.
    rise_t: float = 2.5
    # Steps in each window.
    window_steps: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(self.ratio > 1, "ratio", "> 1")
        for key in ("min_growth", "min_kl"):
            self._check_key(getattr(self, key) >= 0, key, ">= 0")
        self._check_key(self.rise_t > 0, "rise_t", "> 0")
        self._check_key(_steps(self.window_steps, 2), "window_steps", "an integer >= 2")


@dataclass
class DegenerateOutputsConf(MonitorConf):
    """Responses that repeat n-grams, are made of one token, or hit the length budget at a rising rate
    (rlharness/health/outputs.py): each share's mean over the last `window_steps` against its mean over
    the first `window_steps`."""

    section: ClassVar[str] = "degenerate_outputs"
    # Repetition is counted in n-grams of this many tokens.
    ngram: int = 3
    # A response repeats itself when at least this share of its n-grams occurred earlier in it.
    repeat_share: float = 0.5
    # Alarm when the share of degenerate responses (repeating, one token, empty) is above this ...
    max_frac: float = 0.3
    # ... and this much above the run's start.
    min_rise: float = 0.2
    # Alarm when the share of responses cut by the budget (`rollout/truncated_frac`) is this much above the start.
    truncated_rise: float = 0.3
    # Steps in each mean.
    window_steps: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(_steps(self.ngram, 1), "ngram", "an integer >= 1")
        for key in ("repeat_share", "max_frac", "min_rise", "truncated_rise"):
            self._check_key(0 < getattr(self, key) <= 1, key, "0 < x <= 1")
        self._check_key(_steps(self.window_steps, 1), "window_steps", "an integer >= 1")


@dataclass
class ZeroSignalConf(MonitorConf):
    """Every group of `steps` consecutive steps had equal rewards (`rollout/groups_zero_signal_frac` = 1)."""

    section: ClassVar[str] = "zero_signal"
    # Consecutive steps in which every group had equal rewards (no learning signal) before the alarm.
    steps: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(_steps(self.steps, 1), "steps", "an integer >= 1")


@dataclass
class RewardFrozenConf(MonitorConf):
    """The reward distribution stopped moving (rlharness/health/learning_signal.py)."""

    section: ClassVar[str] = "reward_frozen"
    # Alarm when the step-to-step standard deviation of `rollout/reward_mean` is below this share of the
    # standard error sampling alone gives a step's mean.
    max_ratio: float = 0.1
    # Steps it is measured over.
    window_steps: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(self.max_ratio > 0, "max_ratio", "> 0")
        self._check_key(_steps(self.window_steps, 3), "window_steps", "an integer >= 3")


@dataclass
class HostMemoryConf(MonitorConf):
    """The run's resident memory (this process and its children) growing step after step
    (rlharness/health/memory.py)."""

    section: ClassVar[str] = "host_memory"
    # Alarm when memory grows faster than this (MB per step), or fast enough to use up the available memory
    # before total_steps ...
    max_mb_per_step: float = 100.0
    # ... and the growth is this many standard errors sure.
    rise_t: float = 3.0
    # Steps left out at the start (start-up and allocators grow memory in the first steps of every run).
    warmup_steps: int = 10
    # Steps the slope is taken over.
    window_steps: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_key(self.max_mb_per_step > 0, "max_mb_per_step", "> 0")
        self._check_key(self.rise_t > 0, "rise_t", "> 0")
        self._check_key(_steps(self.warmup_steps, 0), "warmup_steps", "an integer >= 0")
        self._check_key(_steps(self.window_steps, 3), "window_steps", "an integer >= 3")


HEALTH_MONITORS = ("reward_hacking", "entropy_collapse", "kl_acceleration", "degenerate_outputs", "zero_signal",
                   "reward_frozen", "host_memory")


@dataclass
class HealthConf:
    """Training-health monitors (rlharness/health/, docs/operations/health.md): each logs `health/...`
    every step and, when it fires, one warning line; `on_alarm` (or a monitor's own) says whether the run
    goes on (warn) or stops, keeping its last checkpoint (stop: exit status 3)."""

    # The monitors that run (an empty list: none).
    monitors: list[str] = field(default_factory=lambda: list(HEALTH_MONITORS))
    # What the run does when a monitor fires (unless the monitor's own on_alarm says): warn | stop.
    on_alarm: str = "warn"
    # Each monitor's thresholds and action.
    reward_hacking: RewardHackingConf = field(default_factory=RewardHackingConf)
    entropy_collapse: EntropyCollapseConf = field(default_factory=EntropyCollapseConf)
    kl_acceleration: KLAccelerationConf = field(default_factory=KLAccelerationConf)
    degenerate_outputs: DegenerateOutputsConf = field(default_factory=DegenerateOutputsConf)
    zero_signal: ZeroSignalConf = field(default_factory=ZeroSignalConf)
    reward_frozen: RewardFrozenConf = field(default_factory=RewardFrozenConf)
    host_memory: HostMemoryConf = field(default_factory=HostMemoryConf)

    def __post_init__(self) -> None:
        _one_of("health.on_alarm", self.on_alarm, ON_ALARM)
        for name in self.monitors:
            _one_of("health.monitors[]", name, HEALTH_MONITORS)

    def action(self, monitor: str) -> str:
        """warn | stop for one monitor: its own `on_alarm`, else the run's."""
        own = getattr(self, monitor).on_alarm
        return self.on_alarm if own is None else own
