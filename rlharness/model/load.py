"""Load a Hugging Face causal LM and its tokenizer from `model.path` (any checkpoint dir).

The embedded default (`assets/tiny-arith`) goes through exactly this code. Relative
paths resolve against the current directory first, then the project root, so
`python train.py` works from anywhere inside a Hydra run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from rlharness.config.schema import ConfigError, ModelConf

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Any one of these makes a directory loadable by AutoTokenizer (fast, SentencePiece, BPE, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer.tiktoken",
                   "spiece.model")

# Model folders that are not in the repo, and the command that makes each one.
FETCH_COMMANDS = {"smollm2-135m-instruct": "bash scripts/fetch_smollm2.sh"}


# The first bytes of every GGUF file (llama.cpp's format).
GGUF_MAGIC = b"GGUF"
GGUF_CONVERT = "python scripts/fetch_smollm2.py --gguf {file} --out <new folder>"


def _gguf_files(candidate: Path) -> list[Path]:
    if candidate.is_file():
        if candidate.suffix.lower() == ".gguf":
            return [candidate]
        try:
            with candidate.open("rb") as fh:
                return [candidate] if fh.read(4) == GGUF_MAGIC else []
        except OSError:  # unreadable: reported as "no Hugging Face checkpoint there"
            return []
    return sorted(candidate.glob("*.gguf")) if candidate.is_dir() else []


def resolve_model_path(path: str, key: str = "model") -> Path:
    """The folder `path` names (the current directory first, then the project); refusals name `key`.path."""
    p = Path(path).expanduser()
    for candidate in (p, PROJECT_ROOT / p):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    for candidate in (p, PROJECT_ROOT / p):
        gguf = _gguf_files(candidate)
        if gguf:  # transformers reads GGUF only through gguf_file= and cannot train or save it as such
            raise ConfigError(
                f"{key}.path={path!r}: {gguf[0].resolve()} is a GGUF file (llama.cpp's format), not a Hugging "
                f"Face checkpoint folder; convert it into one first: `{GGUF_CONVERT.format(file=gguf[0])}` "
                f"(`bash scripts/fetch_smollm2.sh` does it for SmolLM2-135M-Instruct)")
    fetch = FETCH_COMMANDS.get(p.name)
    if fetch:
        raise ConfigError(f"{key}.path={path!r}: the model is not there yet; make it with `{fetch}`")
    raise ConfigError(
        f"{key}.path={path!r}: no Hugging Face checkpoint there (looked for config.json in "
        f"{p.resolve()} and {(PROJECT_ROOT / p).resolve()})"
    )


def remote_code_classes(config: dict) -> list[str]:
    """The Auto classes config.json maps to code in the folder (`auto_map`: a causal LM, a sequence
    classifier, ...) when transformers has no built-in class for its model type: loading the folder
    then runs its Python (trust_remote_code)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    auto_map = config.get("auto_map") or {}
    if config.get("model_type") in CONFIG_MAPPING:  # transformers' own classes are used; auto_map is ignored
        return []
    return [f"{k} -> {v}" for k, v in auto_map.items() if k.startswith("AutoConfig") or k.startswith("AutoModel")]


def check_model_files(conf: ModelConf, key: str = "model", trust_key: str | None = None) -> Path:
    """What the folder's files tell before anything loads (preflight): it exists, is no GGUF file, and
    needs no code of its own unless `conf.trust_remote_code` allows it. `key`: where the folder is
    configured (model, algo.critic, judger, ...): refusals name `<key>.path`, and the switch that applies to
    that folder, `trust_key` (default `<key>.trust_remote_code`)."""
    path = resolve_model_path(conf.path, key)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{key}.path={conf.path!r}: {path / 'config.json'} is not a readable JSON file ({exc})")
    if not isinstance(config, dict):
        raise ConfigError(f"{key}.path={conf.path!r}: {path / 'config.json'} is not a JSON object")
    custom = remote_code_classes(config) if config.get("auto_map") else []
    if custom and not conf.trust_remote_code:
        raise ConfigError(
            f"{key}.path={conf.path!r}: the model's own code is needed (config.json auto_map: {'; '.join(custom)}; "
            f"model_type {config.get('model_type')!r} is not one transformers knows); pass "
            f"{trust_key or key + '.trust_remote_code'}=true to run that code (only for a folder you trust)")
    return path


def require_chat_template(tokenizer, key: str, model_path: str | None = None) -> None:
    """`key` (a task's `apply_chat_template`) asks for the model's chat template: refuse a tokenizer without
    (`model_path`: the user's model.path, else the folder the tokenizer came from)."""
    if not getattr(tokenizer, "chat_template", None):
        path = model_path or tokenizer.name_or_path
        raise ConfigError(f"{key}=true but model.path={path!r} has no chat template (its tokenizer defines none): "
                          f"use a chat/instruct model, or {key}=false to send the prompts as plain text")


def check_token_ids(conf: ModelConf, tokenizer, prompts: dict[str, list[str]], encode) -> None:
    """Every id the run feeds the model must be a row of its embedding: a tokenizer larger than the model's
    vocabulary (another model's, or tokens added without resizing) is refused on the first prompt
    (`prompts`: task label -> prompt texts) or special token outside it."""
    vocab = int(load_model_config(conf).get_text_config().vocab_size)
    if len(tokenizer) <= vocab:
        return  # no id the tokenizer produces can be out of range
    where = f"model.path={conf.path!r}: the model's vocabulary has {vocab} tokens (config.json vocab_size) but"
    fix = (f"the tokenizer ({len(tokenizer)} tokens) does not fit this model: save the model's own tokenizer "
           f"next to its weights, or resize its embeddings to the tokenizer")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        tid = getattr(tokenizer, name)
        if tid is not None and tid >= vocab:
            raise ConfigError(f"{where} the tokenizer's {name} is {tid}; {fix}")
    for label, texts in prompts.items():
        for i, text in enumerate(texts):
            bad = [t for t in encode(text) if t >= vocab]
            if bad:
                raise ConfigError(f"{where} {label} prompt {i} encodes to token id {max(bad)} "
                                  f"({tokenizer.convert_ids_to_tokens(max(bad))!r}); {fix}")


def text_codec(tokenizer) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """(encode, decode) of a tokenizer as the run uses them (judgers, agents, the trainer)."""
    bos = tokenizer.bos_token

    def encode(text: str) -> list[int]:
        # Chat templates already start with BOS; don't add a second one.
        return tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return encode, decode


# Tokenizers this process loaded, by folder (and its tokenizer files' stamps: a rewritten folder is read
# again): the build, the engine, the backend and preflight share one instead of loading it four times.
_TOKENIZERS: dict[tuple, Any] = {}


def load_tokenizer(conf: ModelConf, shared: bool = True):
    """`conf.path`'s tokenizer (pad = eos when it has none). Shared within the process unless `shared` is
    False (a caller that changes it, e.g. its padding side, takes its own)."""
    path = resolve_model_path(conf.path)
    stamps = tuple((f, st.st_mtime_ns, st.st_size) for f in TOKENIZER_FILES
                   if (st := _stat(Path(path) / f)) is not None)
    key = (str(path), conf.trust_remote_code, stamps)
    if shared and key in _TOKENIZERS:
        return _TOKENIZERS[key]
    tok = _read_tokenizer(conf, path)
    if shared:
        _TOKENIZERS[key] = tok
    return tok


def _stat(path: Path):
    try:
        return path.stat()
    except OSError:
        return None


def _read_tokenizer(conf: ModelConf, path):
    from transformers import AutoTokenizer

    if Path(path).is_dir() and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        # transformers would guess at a missing package ("install sentencepiece or tiktoken").
        raise ConfigError(f"model.path={conf.path!r}: the directory holds no tokenizer (none of "
                          f"{', '.join(TOKENIZER_FILES)}); save the model's tokenizer there "
                          f"(tokenizer.save_pretrained) next to config.json")
    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=conf.trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model_config(conf: ModelConf):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(resolve_model_path(conf.path)), trust_remote_code=conf.trust_remote_code)


def load_model(conf: ModelConf, device: str = "cpu"):
    # torch here, not at the top: train.py imports this module, and a start refused for its
    # config should not pay for importing torch (most of its CPU time; docs/notes/benchmarks-log.md, issue 21 CI).
    import torch
    from transformers import AutoModelForCausalLM

    from rlharness.core.vml_warmup import warm_up_vml

    warm_up_vml()  # before any forward pass of this process (rlharness/core/vml_warmup.py)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model = AutoModelForCausalLM.from_pretrained(
        str(resolve_model_path(conf.path)),
        dtype=dtypes[conf.dtype],
        attn_implementation=conf.attn_implementation,
        trust_remote_code=conf.trust_remote_code,
    )
    return own_memory(model.to(device))


def own_memory(model):
    """Give every CPU parameter and buffer memory of its own (returns `model`).

    transformers loads safetensors weights as views of a private memory map of the file: a page the
    process has not written still reads the file, so a model file rewritten in place while a run
    is going (a re-fetched or regenerated model, a hard-linked copy written through another link)
    would change the weights a frozen model (the KL reference, the engine before its first
    weight sync) computes with, and a truncated one kills the process with SIGBUS. Copied once here,
    the run computes with what it loaded, whatever happens to the file (docs/notes/resume_race.md).
    """
    import torch  # not at the top: see load_model

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:  # parameters() yields a tied weight once
            if t.device.type == "cpu":
                t.data = t.data.clone()
    return model
