"""A teacher the run cannot use, refused before work starts in one line naming its key.

`check_teacher_folder` (train.py's preflight, before the run directory exists; again when the run is
built): the folder exists, is no GGUF file, needs no code of its own without
`<key>.trust_remote_code=true`, and is a causal LM (config.json). `check_teacher_tokenizer` (when the
run is built, where the task's text is loaded): it reads the student's token ids as the student does
(rlharness/model/same_tokenizer.py) and its embedding holds every id the student's tokenizer makes.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlharness.config.schema import ConfigError, TeacherConf


def causal_lm_architectures() -> set[str]:
    """The class names transformers loads with AutoModelForCausalLM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return names


def check_teacher_folder(conf: TeacherConf, key: str) -> Path:
    """The folder `key`.path names, checked as model.path is, and a causal LM; returns it."""
    from rlharness.model.load import check_model_files

    try:
        folder = check_model_files(conf.model_conf())
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.path=", f"{key}.path=", 1)
                          .replace("model.trust_remote_code", f"{key}.trust_remote_code")) from None
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    architectures = list(config.get("architectures") or [])
    own_code = "AutoModelForCausalLM" in (config.get("auto_map") or {})
    if architectures and not own_code and not set(architectures) & causal_lm_architectures():
        raise ConfigError(f"{key}.path={conf.path}: {folder} is not a causal language model (architectures "
                          f"{architectures}); a teacher scores tokens with an AutoModelForCausalLM folder")
    if not architectures and not own_code:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if config.get("model_type") not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise ConfigError(f"{key}.path={conf.path}: {folder} is not a causal language model (model_type "
                              f"{config.get('model_type')!r}, no architectures)")
    return folder


def check_teacher_tokenizer(conf: TeacherConf, key: str, student_tokenizer, student_path: str,
                            texts: dict[str, list[str]]) -> None:
    """The teacher's tokenizer gives the student's ids for `texts` (label -> a task's prompts) and its
    vocabulary, and its embedding has a row for every id the student's tokenizer makes."""
    from rlharness.model.load import load_model_config, load_tokenizer, text_codec
    from rlharness.model.same_tokenizer import tokenizer_difference

    model_conf = conf.model_conf()
    teacher_tokenizer = load_tokenizer(model_conf)
    difference = tokenizer_difference(student_tokenizer, teacher_tokenizer, texts, text_codec(student_tokenizer)[0],
                                      text_codec(teacher_tokenizer)[0])
    if difference is not None:
        raise ConfigError(f"{key}.path={conf.path}: the teacher's tokenizer is not the student's (model.path="
                          f"{student_path}): {difference}; a teacher scores the student's token ids, so it needs the "
                          f"same tokenizer (cross-tokenizer distillation is not supported)")
    vocab = int(load_model_config(model_conf).get_text_config().vocab_size)
    if vocab < len(student_tokenizer):
        raise ConfigError(f"{key}.path={conf.path}: the teacher's vocabulary has {vocab} tokens (config.json "
                          f"vocab_size), the student's tokenizer {len(student_tokenizer)}: ids past {vocab - 1} "
                          f"would have no row in its embedding")
