"""Load a Hugging Face causal LM and its tokenizer from `model.path` (any checkpoint dir).

The embedded default (`assets/tiny-arith`) goes through exactly this code. Relative
paths resolve against the current directory first, then the project root, so
`python train.py` works from anywhere inside a Hydra run.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlharness.config.schema import ConfigError, ModelConf

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Any one of these makes a directory loadable by AutoTokenizer (fast, SentencePiece, BPE, tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer.tiktoken",
                   "spiece.model")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Model folders that are not in the repo, and the command that makes each one.
FETCH_COMMANDS = {"smollm2-135m-instruct": "bash scripts/fetch_smollm2.sh"}


def resolve_model_path(path: str) -> Path:
    p = Path(path).expanduser()
    for candidate in (p, PROJECT_ROOT / p):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    fetch = FETCH_COMMANDS.get(p.name)
    if fetch:
        raise ConfigError(f"model.path={path!r}: the model is not there yet; make it with `{fetch}`")
    raise ConfigError(
        f"model.path={path!r}: no Hugging Face checkpoint there (looked for config.json in "
        f"{p.resolve()} and {(PROJECT_ROOT / p).resolve()})"
    )


def load_tokenizer(conf: ModelConf):
    from transformers import AutoTokenizer

    path = resolve_model_path(conf.path)
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
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(resolve_model_path(conf.path)),
        dtype=_DTYPES[conf.dtype],
        attn_implementation=conf.attn_implementation,
        trust_remote_code=conf.trust_remote_code,
    )
    return model.to(device)
