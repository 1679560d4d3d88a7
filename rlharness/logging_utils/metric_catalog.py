"""Every metric a run logs: its name, unit, when it is logged and what it measures.

The one list of metric names: `docs/reference/metrics.md` is generated from it
(`python scripts/gen_reference.py`), and the tests hold the code to it: every key of every
`metrics.jsonl` a test run writes, and every metric-shaped string in the package's sources, must
match an entry here (tests/conftest.py, tests/docs/test_reference.py). A new metric gets its entry
here in the same change.

Names are `stage/name`. A `<...>` part stands for a name chosen at run time: `<task>` a task of a
multi-task run (`tasks.<name>`), `<part>` a part of a router judger, `<k>` a staleness in versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # one of UNITS
    when: str  # when the row has it: "every step", "eval steps", "algo=ppo", ...
    what: str


UNITS = {
    "-": "a plain number (an index, a ratio of like quantities)",
    "count": "how many, in the window the row covers (a step, or since the previous row)",
    "fraction": "a share, from 0 to 1",
    "reward": "the judger's score (`reward['score']`), in its own units",
    "nats": "a log-probability or a difference of them, per token",
    "tokens": "tokens",
    "tokens/s": "tokens per second of wall time",
    "samples/s": "samples per second of wall time",
    "s": "seconds of wall time",
    "bytes": "bytes",
    "versions": "weight versions (a version is one weight sync; staleness = train_step - 1 - version)",
    "lr": "a learning rate (the optimizer's step size)",
    "table": "a W&B table (not in metrics.jsonl)",
    "histogram": "a W&B histogram (not in metrics.jsonl)",
    "MB": "megabytes (2^20 bytes)",
}

EVERY_STEP = "every step"
EVAL = "eval steps (step 0, every `eval_every` and the last)"
MULTI_TASK = "every step, multi-task runs (`tasks.<name>`)"
MULTI_TASK_EVAL = "eval steps, multi-task runs"
PPO = "every step, `algo=ppo` (`algo.advantage=gae`)"
DISTILL = "every step, with a teacher (`algo=opd`, `algo.teacher.path`)"

_M = Metric
METRICS: tuple[Metric, ...] = (
    _M("step", "-", "every row", "The training step the row is about (0: the evaluation before training)."),
    # ------------------------------------------------------------------ train: the optimizer step
    _M("train/loss", "-", EVERY_STEP, "The total loss the optimizer minimised (policy loss + KL and entropy terms), "
       "mean over the step's optimizer updates."),
    _M("train/pg_loss",
       "-", EVERY_STEP, "The policy-gradient part of the loss (`algo.policy_loss`), mean over updates."),
    _M("train/kl", "nats", EVERY_STEP, "KL to the reference policy per response token (`algo.kl_estimator`); 0 "
       "without a reference (`algo.kl_coef=0`)."),
    _M("train/entropy", "nats", EVERY_STEP, "Entropy of the policy per response token."),
    _M("train/grad_norm", "-", EVERY_STEP, "Gradient norm before clipping (`algo.grad_clip`), mean over updates."),
    _M("train/clip_frac", "fraction", EVERY_STEP, "Share of response tokens whose ratio was clipped by the policy "
       "loss (CISPO: whose detached weight was clipped)."),
    _M("train/lr", "lr", EVERY_STEP, "The policy's learning rate at this step (`algo.lr_schedule`)."),
    _M("train/tis_ratio_mean", "-", EVERY_STEP, "Mean importance ratio between the trainer's and the engine's "
       "log-probs (behaviour or proximal policy) before truncation; 1 on-policy."),
    _M("train/tis_truncated_frac", "fraction", EVERY_STEP, "Share of tokens whose importance weight was truncated "
       "at `algo.tis_cap`."),
    _M("train/rejected_frac", "fraction", EVERY_STEP, "Share of tokens masked by `algo.rejection` (token or "
       "sequence ratio outside `[rejection_low, rejection_high]`)."),
    _M("train/logprob_diff_rollout", "nats", EVERY_STEP, "Mean |engine log-prob - trainer log-prob| per response "
       "token, before the update: engine numerics and staleness. The on-policy guard warns above "
       "`algo.onpolicy_logprob_gap_warn`."),
    _M("train/logprob_diff_rollout_max", "nats", EVERY_STEP, "The worst token's |engine - trainer| log-prob."),
    _M("train/num_updates", "count", EVERY_STEP, "Optimizer updates taken this step (`algo.ppo_epochs` x "
       "`algo.mini_batches`, less any skipped)."),
    _M("train/micro_batches", "count", EVERY_STEP, "Forward/backward passes of one rank over the step (all epochs "
       "and mini-batches): what `explain=true` predicts."),
    _M("train/skipped_updates", "count", EVERY_STEP, "Optimizer updates skipped this step because their loss or "
       "gradient was not finite."),
    _M("train/weights_finite",
       "-", EVERY_STEP, "1 when every weight is finite after the step, else 0 (the run stops)."),
    _M("train/response_tokens", "tokens", EVERY_STEP, "Response tokens trained (loss-masked tokens excluded)."),
    _M("train/tokens", "tokens", "every step, `backend=sim`", "Tokens the simulated trainer was charged for."),
    _M("train/nonfinite_steps", "count", EVERY_STEP, "Steps skipped as non-finite since the run started "
       "(`trainer.max_nonfinite_steps` in a row stop it)."),
    _M("train/nonfinite_step", "-", EVERY_STEP, "1 when this step was skipped as non-finite, else 0."),
    # ------------------------------------------------------------------ critic (PPO)
    _M("critic/value_loss", "-", PPO, "The critic's clipped value loss, mean over its updates."),
    _M("critic/vf_clip_frac", "fraction", PPO, "Share of tokens whose new value was clipped "
       "(`algo.critic.cliprange_value`)."),
    _M("critic/vf_explained_var", "-", PPO, "Explained variance of the returns by the values (1: perfect, 0: no "
       "better than their mean; 0 when the returns do not vary)."),
    _M("critic/values_mean", "reward", PPO, "Mean value the critic gave the batch's response tokens."),
    _M("critic/returns_mean", "reward", PPO, "Mean GAE return of the batch's response tokens."),
    _M("critic/advantages_raw_mean", "reward", PPO, "Mean GAE advantage before whitening."),
    _M("critic/grad_norm", "-", PPO, "The critic's gradient norm before clipping (`algo.critic.grad_clip`)."),
    _M("critic/lr", "lr", PPO, "The critic's learning rate (`algo.critic.lr`)."),
    _M("critic/kl_reward", "nats", "every step, `algo=ppo` with `algo.kl_reward_coef` > 0",
       "Mean per-token KL (old - reference log-prob) folded into the rewards."),
    # ------------------------------------------------------------------ rollout: the trained batch
    _M("rollout/reward_mean", "reward", EVERY_STEP, "Mean reward of the trained batch's samples."),
    _M("rollout/reward_std", "reward", EVERY_STEP, "Standard deviation of the trained batch's rewards."),
    _M("rollout/reward_max", "reward", EVERY_STEP, "Largest reward in the trained batch."),
    _M("rollout/reward_min", "reward", EVERY_STEP, "Smallest reward in the trained batch."),
    _M("rollout/reward_<part>_mean", "reward", "every step, `judger=router`",
       "Mean score of one part of the router (e.g. `reward_model`, `math`) on the trained batch."),
    _M("rollout/response_len_mean", "tokens", EVERY_STEP, "Mean response length of the trained batch."),
    _M("rollout/response_len_max", "tokens", EVERY_STEP, "Longest response of the trained batch."),
    _M("rollout/response_len_min", "tokens", EVERY_STEP, "Shortest response of the trained batch."),
    _M("rollout/truncated_frac", "fraction", EVERY_STEP, "Share of trained samples cut by the token budget "
       "(`agent.sampling.max_tokens`)."),
    _M("rollout/truncated_masked_frac", "fraction", EVERY_STEP, "Share of trained samples given no loss because "
       "they were truncated (`algo.mask_truncated`)."),
    _M("rollout/overlong_penalty_mean", "reward", EVERY_STEP, "Mean DAPO overlong penalty added to the rewards "
       "(`algo.overlong_buffer_len`; 0 when off)."),
    _M("rollout/adv_abs_mean", "-", "every step (not with `algo=ppo` or `algo=opd`)", "Mean |advantage| of the "
       "trained samples from their rewards (a teacher's per-token term not included: `distill/*`)."),
    _M("rollout/groups_zero_signal_frac", "fraction", EVERY_STEP, "Share of trained groups whose rewards were all "
       "equal: they train nothing (the health monitor `zero_signal` warns after `health.zero_signal.steps` steps at 1)."),
    _M("rollout/num_groups", "count", EVERY_STEP, "Prompt groups trained (`batch_size`)."),
    _M("rollout/num_samples", "count", EVERY_STEP, "Samples trained (groups x `sampler.prompt_repeat_k`)."),
    _M("rollout/num_response_tokens", "tokens", EVERY_STEP, "Response tokens in the trained batch."),
    # ------------------------------------------------------------------ distill: on-policy distillation
    _M("distill/reverse_kl", "nats", DISTILL, "Mean per trained token of log pi_student - log pi_teacher of the "
       "sampled token (the student's rollout log-prob; a one-sample estimate of KL(student || teacher))."),
    _M("distill/reverse_kl_max", "nats", DISTILL, "The largest per-token reverse KL of the batch."),
    _M("distill/teacher_logprob_mean", "nats", DISTILL, "Mean per trained token of the teacher's log-prob of the "
       "student's sampled token."),
    # ------------------------------------------------------------------ rollout: production since the last batch
    _M("rollout/groups_filtered",
       "count", EVERY_STEP, "Groups dropped by `strategy.group_filter` since the last batch."),
    _M("rollout/groups_failed", "count", EVERY_STEP, "Groups that failed (judging, agent loop, teacher) since the last batch; "
       "reasons in `rollouts/dropped.jsonl`."),
    _M("rollout/groups_aborted", "count", EVERY_STEP, "Groups interrupted by a pause (weight sync) since the last "
       "batch; they go back to the buffer and continue or restart."),
    _M("rollout/groups_cancelled", "count", EVERY_STEP, "Groups cancelled (stop, shutdown) since the last batch."),
    _M("rollout/groups_abort_capped", "count", EVERY_STEP, "Groups FAILED after `strategy.max_aborts` interruptions "
       "without partial rollout."),
    _M("rollout/members_failed_infra", "count", EVERY_STEP, "Members of the groups generated since the last batch "
       "that failed for a reason that is not the policy's (an agent program that crashed, hung or never called the "
       "model, a tool sandbox that could not start, the judger's limits); `algo.failed_member_policy` decides "
       "what training does with them."),
    _M("rollout/members_masked", "count", EVERY_STEP, "Members of this batch left out of their group's advantage "
       "statistics and of the loss (`algo.failed_member_policy=mask`)."),
    _M("rollout/branch_rows", "count", EVERY_STEP, "Training rows beyond one per sample: the extra token sequences "
       "(branches) of gateway samples whose agent called in parallel or restarted its conversation."),
    _M("rollout/groups_in_flight", "count", EVERY_STEP, "Groups being generated when the row was written."),
    _M("rollout/tokens_generated", "tokens", EVERY_STEP, "Tokens the engines generated since the last batch."),
    _M("rollout/tokens_wasted", "tokens", EVERY_STEP, "Generated tokens thrown away since the last batch (expired "
       "groups, restarts without partial rollout)."),
    _M("rollout/samples_generated", "count", EVERY_STEP, "Samples generated since the last batch, trained or not."),
    _M("rollout/raw_reward_mean", "reward", EVERY_STEP, "Mean reward of every sample judged since the last batch, "
       "before filtering."),
    _M("rollout/raw_reward_std", "reward", EVERY_STEP, "Standard deviation of those rewards."),
    _M("rollout/raw_samples_judged", "count", EVERY_STEP, "Samples judged since the last batch."),
    _M("buffer/expired", "count", EVERY_STEP, "Groups the replay buffer expired as too stale since the last batch "
       "(token staleness mode)."),
    # ------------------------------------------------------------------ rollout: per task
    _M("rollout/<task>/num_groups", "count", MULTI_TASK, "Groups of this task in the trained batch."),
    _M("rollout/<task>/reward_mean", "reward", MULTI_TASK, "Mean reward of this task's trained samples."),
    _M("rollout/<task>/response_len_mean",
       "tokens", MULTI_TASK, "Mean response length of this task's trained samples."),
    _M("rollout/<task>/raw_reward_mean", "reward", MULTI_TASK, "Mean reward of this task's samples judged since the "
       "last batch, before filtering."),
    _M("rollout/<task>/groups_generated", "count", MULTI_TASK, "This task's groups that came back from generation "
       "since the last batch (kept, dropped or aborted)."),
    _M("rollout/<task>/groups_filtered", "count", MULTI_TASK, "This task's groups filtered since the last batch."),
    _M("rollout/<task>/groups_failed", "count", MULTI_TASK, "This task's groups failed since the last batch."),
    _M("rollout/<task>/groups_aborted", "count", MULTI_TASK, "This task's groups aborted since the last batch."),
    # ------------------------------------------------------------------ staleness
    _M("staleness/mean", "versions", EVERY_STEP, "Mean staleness of the trained tokens (train_step - 1 - the version "
       "that produced each token)."),
    _M("staleness/max", "versions", EVERY_STEP, "Staleness of the batch's oldest token."),
    _M("staleness/admission_mean", "versions", EVERY_STEP, "Mean staleness of the trained groups when they were "
       "admitted (`strategy.staleness_mode=admission`; 0 otherwise)."),
    _M("staleness/admission_max", "versions", EVERY_STEP, "Largest staleness at admission in the batch (at most "
       "`max_staleness` in admission mode)."),
    _M("staleness/tokens_at_<k>", "tokens", EVERY_STEP, "Trained tokens whose staleness is k (the histogram of "
       "`plots/staleness_hist.png`)."),
    _M("staleness/<task>/max", "versions", MULTI_TASK, "Staleness of this task's oldest trained token."),
    _M("staleness/<task>/admission_max",
       "versions", MULTI_TASK, "Largest staleness at admission among this task's groups."),
    # ------------------------------------------------------------------ eval
    _M("eval/accuracy", "fraction", EVAL, "Greedy pass@1 on the held-out split (`eval.num_prompts` prompts); a "
       "multi-task run: the mean over tasks weighted by their mix weights. Absent when nothing could be judged."),
    _M("eval/avg@n", "fraction", "eval steps, `eval.num_samples` or `eval.pass_k` > 1",
       "Mean accuracy of the n samples "
       "per prompt drawn at `eval.temperature`."),
    _M("eval/pass@k", "fraction", "eval steps, `eval.num_samples` or `eval.pass_k` > 1", "Unbiased pass@k (Chen et "
       "al. 2021) from the n >= k samples per prompt."),
    _M("eval/judge_failed", "count", EVAL, "Eval samples whose judgement failed (left out of the accuracies)."),
    _M("eval/tool_use_frac", "fraction", "eval steps, `agent=multi_turn_tool`", "Share of greedy eval answers that "
       "called a tool."),
    _M("eval/tool_answer_frac", "fraction", "eval steps, `agent=multi_turn_tool`", "Share of greedy eval answers whose "
       "tool output was the gold answer."),
    _M("eval/<task>/accuracy", "fraction", MULTI_TASK_EVAL, "This task's greedy pass@1."),
    _M("eval/<task>/avg@n", "fraction", MULTI_TASK_EVAL, "This task's avg@n."),
    _M("eval/<task>/pass@k", "fraction", MULTI_TASK_EVAL, "This task's pass@k."),
    _M("eval/<task>/judge_failed", "count", MULTI_TASK_EVAL, "This task's failed eval judgements."),
    _M("eval/<task>/tool_use_frac", "fraction", MULTI_TASK_EVAL, "This task's share of answers that called a tool."),
    _M("eval/<task>/tool_answer_frac", "fraction", MULTI_TASK_EVAL, "This task's share of answers whose tool output "
       "was the gold answer."),
    # ------------------------------------------------------------------ judge: counts since the previous row
    _M("judge/groups_failed",
       "count", EVERY_STEP, "Groups whose judging failed since the previous row (eval included)."),
    _M("judge/timeouts", "count", EVERY_STEP, "Judgements past `agent.judge_timeout_s` (or the remote judger's "
       "request timeout) since the previous row."),
    _M("judge/memory_or_crash", "count", "every step, rule and learned judgers", "Judging processes that hit "
       "`judger.worker_memory_mb` or crashed."),
    _M("judge/scored_zero_on_timeout", "count", "every step, rule and learned judgers", "Members scored 0 instead "
       "of failing their group (`judger.on_timeout=zero`)."),
    _M("judge/processes_replaced", "count", "every step, rule and learned judgers", "Judging processes killed and "
       "replaced (timeouts, memory, crashes)."),
    _M("judge/rewards_out_of_range", "count", EVERY_STEP, "Rewards refused as not finite or beyond float32's range "
       "(their groups fail)."),
    _M("judge/requests", "count", "every step, `judger=remote`", "HTTP requests sent (attempts, retries included)."),
    _M("judge/retries", "count", "every step, `judger=remote`", "Requests retried (connection errors, timeouts, "
       "429, 5xx)."),
    _M("judge/redirects_refused", "count", "every step, `judger=remote`", "Redirect answers refused (never followed)."),
    _M("judge/malformed_replies", "count", "every step, `judger=remote`", "Replies that were not JSON, too deeply "
       "nested, or held no numeric score."),
    _M("judge/scoring_calls", "count", "every step, `judger=reward_model`", "Calls to the reward model's scoring "
       "process (waiting groups go together in one call)."),
    _M("judge/unparseable", "count", "every step, `judger=llm`",
       "Judge answers `judger.score_pattern` could not read."),
    _M("judge/judge_requests", "count", "every step, `judger=llm`", "Prompts sent to the LLM judge's engine."),
    _M("judge/<task>/<count>", "count", "every step, multi-task runs", "One task's judger count (any `judge/<count>` "
       "above); `judge/<count>` is their sum over tasks."),
    # ------------------------------------------------------------------ agent
    _M("agent/calls_per_sample", "-", "every step, `agent=openai_gateway`", "Model calls the agent program made per "
       "trained sample."),
    _M("agent/prefix_mismatch", "count", "every step, `agent=openai_gateway`", "Calls whose text matched no token "
       "sequence of their sample at all (a new sequence was tokenised from the text; every sequence is trained)."),
    _M("agent/segments_per_sample", "-", "every step, `agent=openai_gateway`", "Token sequences trained per sample "
       "(1 for a sequential agent; parallel calls and edited histories add branches)."),
    _M("agent/token_drift_frac", "fraction", "every step, `agent=openai_gateway`", "Share of the batch's samples "
       "whose trained tokens differ from their final conversation re-rendered with the chat template and tokenised "
       "whole (the first divergence is in the sample's ledger row, `token_drift`)."),
    _M("agent/requests_refused", "count", "every step, `agent=openai_gateway`", "Requests the gateway refused with "
       "an API error (a field it does not honour, another model name, bad JSON, a body too large, a prompt past the "
       "model's context, the sample's budget spent) since the last batch."),
    _M("agent/tool_calls_per_sample", "-", "every step, `agent=multi_turn_tool`", "Tool calls per trained sample "
       "(every tool: calculator, python)."),
    _M("agent/tool_failed_frac", "fraction", "every step, `agent=multi_turn_tool`", "Share of the step's tool calls "
       "that did not end `ok` (the program raised, hit a sandbox limit, or the budget was spent)."),
    _M("agent/tool_s_per_sample", "s", "every step, `agent=multi_turn_tool`", "Seconds of tool time per trained "
       "sample (a python call: its sandbox's wall time)."),
    # ------------------------------------------------------------------ perf: time and throughput
    _M("perf/step_s", "s", EVERY_STEP, "Wall time of the step, evaluation excluded."),
    _M("perf/teacher_s", "s", DISTILL, "Seconds the distillation teachers' scoring calls took since the previous "
       "step (colocated: within `perf/rollout_s`; `mode=disagg`: on the teacher's actor, beside training)."),
    _M("perf/rollout_s", "s", EVERY_STEP, "Time the step waited for its batch (colocated: generated it)."),
    _M("perf/train_s", "s", EVERY_STEP, "Time of the training call."),
    _M("perf/weight_sync_s", "s", EVERY_STEP, "Time of the weight sync to the engines (0 without one)."),
    _M("perf/weight_sync_bytes",
       "bytes", EVERY_STEP, "Bytes the weight sync sent, in the engine's dtype (LoRA `adapter`: the adapters "
       "only; delta syncs, `engine.weight_delta`: the changed values and their indices)."),
    _M("perf/eval_s", "s", EVAL, "Wall time of the evaluation."),
    _M("perf/produce_s", "s", EVERY_STEP, "Time the producer's strategies ran since the last batch."),
    _M("perf/tokens_per_s", "tokens/s", EVERY_STEP, "Trained response tokens per second of the step."),
    _M("perf/samples_per_s", "samples/s", EVERY_STEP, "Trained samples per second of the step."),
    _M("perf/trainer_idle_frac", "fraction", EVERY_STEP, "Share of the step the trainer waited for its batch "
       "(`mode=disagg`: production fell behind)."),
    _M("perf/train_worker_s", "s", "every step, `mode=disagg` or `backend=deepspeed`", "Time inside the training "
       "actor's call (the rest of `perf/train_s` is shipping the batch and the call's round trip)."),
    _M("perf/padding_frac", "fraction", "every step (backends torch, deepspeed, fsdp2)", "Share of the tokens "
       "the policy's training forwards computed that were padding (`backend.packing`: only each packed row's "
       "end; padded rows: each row up to its micro-batch's longest)."),
    _M("perf/rank_token_imbalance", "-", "every step, `backend=deepspeed`", "Max over mean tokens per rank "
       "(`backend.balance_ranks`; 1 = balanced)."),
    # ------------------------------------------------------------------ perf: the engines' counters
    _M("perf/engine_busy_frac", "fraction", "every step (not colocated `engine=vllm`)",
       "Share of time the engines were generating (the mean over "
       "engines)."),
    _M("perf/engine_busy_s", "s", "every step, `engine=sim`",
       "Seconds with at least one request running, since start."),
    _M("perf/engine_busy_slot_s", "s", "every step, `engine=sim`", "Slot-seconds spent generating, since start."),
    _M("perf/engine_elapsed_s", "s", "every step, `engine=sim`", "Seconds since the engine's first request."),
    _M("perf/engine_tokens", "tokens", "every step, `engine=hf|sim`", "Tokens generated (hf: since the previous row; "
       "sim: since start)."),
    _M("perf/engine_tokens_per_s", "tokens/s", "every step, `engine=hf`", "Tokens generated per second since the "
       "previous row."),
    _M("perf/engine_tokens_total", "tokens", "every step, `engine=vllm`", "Tokens vLLM generated since start."),
    _M("perf/engine_requests", "count", "every step, `engine=sim`", "Requests received since start."),
    _M("perf/engine_requests_finished", "count", "every step, `engine=hf`",
       "Requests finished since the previous row."),
    _M("perf/engine_aborted", "count", "every step, `engine=sim`", "Requests aborted since start."),
    _M("perf/engine_in_flight", "count", "every step, `engine=sim` or `mode=disagg`", "Requests running or queued."),
    _M("perf/engine_running", "count", "every step", "Requests being decoded."),
    _M("perf/engine_waiting", "count", "every step, `engine=hf`", "Requests queued for a free row of the batch."),
    _M("perf/engine_max_active", "count", "every step, `engine=sim`", "Most requests ever running at once."),
    _M("perf/engine_mean_batch_size", "-", "every step, `engine=hf`",
       "Mean rows per decode step since the previous row."),
    _M("perf/engine_mean_batch_occupancy", "fraction", "every step, `engine=hf`", "Mean rows per decode step over "
       "`engine.max_batch_size`."),
    _M("perf/engine_weight_syncs", "count", "every step, `engine=vllm`", "Weight syncs vLLM received since start."),
    _M("perf/engine_inflight_frac", "fraction", "every step, `mode=disagg`", "Share of time since the previous row "
       "with at least one request in flight to the engine actors."),
    _M("perf/engine_requests_per_call", "-", "every step, `mode=disagg`", "Requests coalesced per actor call."),
    _M("perf/engine_restarts", "count", "every step, `mode=disagg`", "Engine actors restarted after dying."),
    _M("perf/engine_requests_failed", "count", "every step, `mode=disagg`", "Requests lost with a dead engine actor "
       "(their groups are re-sampled)."),
    _M("perf/engine_weight_loads", "count", "every step, `mode=disagg`", "Weight loads the engine actors completed."),
    _M("perf/engine_version", "versions", "every step, `mode=disagg`", "Weight version the engine actors hold (mean "
       "over engines)."),
    # ------------------------------------------------------------------ health: the monitors (docs/operations/health.md)
    _M("health/alarms", "count", "every row", "Health alarms raised by this row (each also a warning line)."),
    _M("health/eval_drop_z", "-", "eval steps, a learned reward trains", "Standard errors by which `eval/accuracy` "
       "lies below its best earlier eval (`reward_hacking`)."),
    _M("health/reward_rise_t", "-", "eval steps, a learned reward trains", "t statistic of `rollout/reward_mean`'s "
       "slope since the best eval (`reward_hacking`)."),
    _M("health/part_rise_t", "-", "every step, `judger=router`", "t statistic of the most rising router part's slope "
       "over `health.reward_hacking.window_steps` (`reward_hacking`)."),
    _M("health/part_fall_t", "-", "every step, `judger=router`", "t statistic of the most falling router part's "
       "slope (`reward_hacking`)."),
    _M("health/entropy_ratio", "-", EVERY_STEP, "`train/entropy` over the last window / over the run's first "
       "(`entropy_collapse`)."),
    _M("health/entropy_reward_gain_sd", "-", EVERY_STEP, "Rise of `rollout/reward_mean` since the run's first "
       "window, in standard deviations of its rewards then (`entropy_collapse`)."),
    _M("health/kl_accel", "-", "every step, with a KL term", "The KL's last window growth / the growth before "
       "(`kl_acceleration`)."),
    _M("health/empty_frac", "fraction", EVERY_STEP, "Share of responses with no token but the stop token."),
    _M("health/one_token_frac", "fraction", EVERY_STEP, "Share of responses made of one token over and over."),
    _M("health/repeat_frac", "fraction", EVERY_STEP, "Share of responses that repeat their n-grams "
       "(`health.degenerate_outputs.ngram`, `repeat_share`)."),
    _M("health/degenerate_frac", "fraction", EVERY_STEP, "Share of responses that are empty, one token, or "
       "repeating (`degenerate_outputs`)."),
    _M("health/degenerate_rise", "fraction", EVERY_STEP, "`health/degenerate_frac` over the last window minus over "
       "the run's first."),
    _M("health/truncated_rise", "fraction", EVERY_STEP, "`rollout/truncated_frac` over the last window minus over "
       "the run's first."),
    _M("health/zero_signal_steps", "count", EVERY_STEP, "Steps in a row whose every group had equal rewards "
       "(`zero_signal`)."),
    _M("health/reward_frozen_ratio", "-", EVERY_STEP, "Step-to-step standard deviation of `rollout/reward_mean` / "
       "the standard error sampling gives it (`reward_frozen`)."),
    _M("health/rss_mb", "MB", "every row", "Resident memory of this process and its children."),
    _M("health/available_mb", "MB", "every row", "Memory the machine still has available."),
    _M("health/rss_mb_per_step", "MB", EVERY_STEP, "Least-squares growth of `health/rss_mb` per step over the last "
       "window (`host_memory`)."),
    # ------------------------------------------------------------------ bias: generated against trained
    _M("bias/trained_len_over_generated", "-", EVERY_STEP, "Mean trained response length / mean length of what "
       "finished generating since the previous step (1: no length bias)."),
    _M("bias/trained_reward_minus_generated", "reward", EVERY_STEP, "Mean trained reward minus mean generated "
       "reward since the previous step."),
    _M("bias/dropped_by_len_bucket/<lo>-<hi>", "fraction", EVERY_STEP, "Samples dropped (filtered, or expired after "
       "they finished) / generated since the start, with a response of `lo` to `hi` tokens (quarters of the "
       "budget)."),
    _M("bias/generated_samples", "count", EVERY_STEP, "Samples that finished generating (judged) since the "
       "previous step."),
    _M("bias/dropped_samples", "count", EVERY_STEP, "Finished samples dropped since the previous step."),
    _M("bias/generated_len", "histogram", "every step, W&B", "Response lengths of what finished generating."),
    _M("bias/trained_len", "histogram", "every step, W&B", "Response lengths of what was trained."),
    _M("bias/generated_reward", "histogram", "every step, W&B", "Rewards of what finished generating."),
    _M("bias/trained_reward", "histogram", "every step, W&B", "Rewards of what was trained."),
    # ------------------------------------------------------------------ probe: worst case first
    _M("perf/probe_s", "s", "step 0, `trainer.probe_longest`", "Time of the probe: one micro-batch of the longest "
       "sample trained and undone."),
    _M("probe/peak_mb", "MB", "step 0, `trainer.probe_longest`", "The process's peak memory after the probe "
       "(resident on CPU, allocated on CUDA)."),
    _M("probe/rows", "count", "step 0, `trainer.probe_longest`", "Rows of the probed micro-batch."),
    _M("probe/tokens", "tokens", "step 0, `trainer.probe_longest`", "Tokens of each probed row (the longest "
       "prompt + the response budget)."),
    # ------------------------------------------------------------------ W&B tables
    _M("rollout/samples", "table", "every `logger.log_samples_every` steps, W&B", "The step's samples (whole groups, "
       "at most `logger.max_sample_rows` rows)."),
    _M("eval/samples", "table", "eval steps, W&B", "The eval's completions with their judgement."),
)

PLACEHOLDER = re.compile(r"<[a-z]+>")
# What a placeholder stands for: a task name (letters, digits, '_', '-'), a staleness, a count's name.
_PLACEHOLDER_RE = r"[A-Za-z0-9_-]+"


@lru_cache(maxsize=None)
def _patterns() -> tuple[tuple[re.Pattern, Metric], ...]:
    out = []
    for m in METRICS:
        parts = PLACEHOLDER.split(m.name)
        out.append((re.compile(_PLACEHOLDER_RE.join(re.escape(p) for p in parts) + r"\Z"), m))
    return tuple(out)


def find_metric(key: str) -> Metric | None:
    """The catalog entry `key` is an instance of (exact names first), or None."""
    exact = [m for m in METRICS if m.name == key]
    if exact:
        return exact[0]
    return next((m for pattern, m in _patterns() if pattern.match(key)), None)


def unknown_keys(keys) -> list[str]:
    """The keys no catalog entry names, sorted."""
    return sorted({k for k in keys if find_metric(k) is None})
