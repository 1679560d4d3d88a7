"""A teacher the run cannot use, refused before work starts in one line naming its key.

`check_teacher_folder` (train.py's preflight, before the run directory exists; again when the run is
built): the folder exists, is no GGUF file, needs no code of its own without
`<key>.trust_remote_code=true`, and is a causal LM (config.json); `check_teacher_vocabulary` (preflight):
its vocabulary, special tokens and embedding fit the student's ids; `check_teacher_encodes_alike` (once the
job has loaded the task's text, before engines, trainer or Ray start): it encodes the task's prompts to the
student's ids.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlharness.config.schema import ConfigError, ModelConf, TeacherConf

SHOWN_IDS = 12  # ids shown of a prompt the two tokenizers encode differently


def causal_lm_architectures() -> set[str]:
    """The class names transformers loads with AutoModelForCausalLM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return names


def check_teacher_folder(conf: TeacherConf, key: str) -> Path:
    """The folder `key`.path names, checked as model.path is, and a causal LM; returns it."""
    from rlharness.model.load import check_model_files, remote_code_classes

    try:
        folder = check_model_files(conf.model_conf())
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.path=", f"{key}.path=", 1)
                          .replace("model.trust_remote_code", f"{key}.trust_remote_code")) from None
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    architectures = list(config.get("architectures") or [])
    # Code of its own (allowed by trust_remote_code in check_model_files): transformers cannot judge its class.
    own_code = bool(remote_code_classes(config))
    if architectures and not own_code and not set(architectures) & causal_lm_architectures():
        raise ConfigError(f"{key}.path={conf.path}: {folder} is not a causal language model (architectures "
                          f"{architectures}); a teacher scores tokens with an AutoModelForCausalLM folder")
    if not architectures and not own_code:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if config.get("model_type") not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise ConfigError(f"{key}.path={conf.path}: {folder} is not a causal language model (model_type "
                              f"{config.get('model_type')!r}, no architectures)")
    return folder


def check_teacher_vocabulary(conf: TeacherConf, key: str, student: ModelConf) -> None:
    """The teacher's tokenizer and embedding read the student's ids as the student does (same vocabulary
    at the same ids, same special tokens, a row for every id: rlharness/model/tokenizer_match.py). Reads
    tokenizers and configs, never weights (preflight)."""
    from rlharness.model.load import resolve_model_path
    from rlharness.model.tokenizer_match import tokenizer_differences

    differences = tokenizer_differences(resolve_model_path(student.path), resolve_model_path(conf.path, key),
                                        trust_remote_code=student.trust_remote_code or conf.trust_remote_code)
    if differences:
        raise ConfigError(f"{key}.path={conf.path!r} is not allowed with model.path={student.path!r}: the teacher "
                          f"scores the student's token ids, but their tokenizers differ "
                          f"({'; '.join(differences[:3])}); use a teacher of the student's model family (the same "
                          f"tokenizer); cross-tokenizer distillation is not supported")


def check_teacher_encodes_alike(conf: TeacherConf, key: str, student_tokenizer, texts: dict[str, list[str]]) -> None:
    """The teacher's tokenizer gives the student's ids for `texts` (label -> a task's prompts): one vocabulary
    can still be encoded differently (normalisers, merges, added tokens)."""
    from rlharness.model.load import load_tokenizer, text_codec

    encode_student, encode_teacher = text_codec(student_tokenizer)[0], text_codec(load_tokenizer(conf.model_conf()))[0]
    for label, items in texts.items():
        for index, text in enumerate(items):
            a, b = encode_student(text), encode_teacher(text)
            if a != b:
                raise ConfigError(f"{key}.path={conf.path!r}: the teacher's tokenizer encodes {label} prompt {index} "
                                  f"to other ids than the student's ({b[:SHOWN_IDS]} vs {a[:SHOWN_IDS]}); a teacher "
                                  f"scores the student's token ids, so it needs the same tokenizer")
