import pytest

from rlharness.config.schema import (ConfigError, CountdownJudgerConf, FormatJudgerConf, JudgerConf,
                                     MathJudgerConf, RemoteJudgerConf, RouterJudgerConf)
from rlharness.judger import build_judger
from rlharness.judger.countdown import CountdownJudger
from rlharness.judger.format import FormatJudger
from rlharness.judger.math import MathJudger
from rlharness.judger.remote import RemoteJudger
from rlharness.judger.router import RouterJudger


def test_format_judger_is_a_full_match():
    j = FormatJudger(FormatJudgerConf(pattern=r"\d+"))
    assert j.score("959", {}) == {"score": 1.0}
    assert j.score("959 ", {}) == {"score": 0.0}
    assert j.score("x959", {}) == {"score": 0.0}
    default = FormatJudger()
    assert default.score("  ", {})["score"] == 0.0 and default.score(" a\n", {})["score"] == 1.0


def test_bad_pattern_names_the_key():
    with pytest.raises(ConfigError, match="judger.pattern"):
        FormatJudger(FormatJudgerConf(pattern="(unclosed"))
    with pytest.raises(ConfigError, match="judger.format_pattern"):
        RouterJudger(RouterJudgerConf(format_pattern="[", weights={"format": 1.0}))


def test_router_weights_parts_and_keeps_each_score():
    router = RouterJudger(RouterJudgerConf(weights={"math": 1.0, "format": 0.25}, format_pattern=r"#### -?\d+"))
    assert router.score("#### 12", {"answer": "12"}) == {"score": 1.25, "math": 1.0, "format": 1.0}
    assert router.score("#### 13", {"answer": "12"}) == {"score": 0.25, "math": 0.0, "format": 1.0}
    assert router.score("it is 12", {"answer": "12"}) == {"score": 1.0, "math": 1.0, "format": 0.0}
    assert router.score("no", {"answer": "12"}) == {"score": 0.0, "math": 0.0, "format": 0.0}


def test_router_refuses_unknown_or_empty_parts():
    with pytest.raises(ConfigError, match="'remote'"):
        RouterJudger(RouterJudgerConf(weights={"remote": 1.0}))
    with pytest.raises(ConfigError, match="judger.weights is empty"):
        RouterJudger(RouterJudgerConf(weights={}))


def test_build_judger_dispatches_on_name():
    assert isinstance(build_judger(MathJudgerConf()), MathJudger)
    assert isinstance(build_judger(CountdownJudgerConf()), CountdownJudger)
    assert isinstance(build_judger(FormatJudgerConf()), FormatJudger)
    assert isinstance(build_judger(RouterJudgerConf()), RouterJudger)
    assert isinstance(build_judger(RemoteJudgerConf()), RemoteJudger)
    with pytest.raises(ConfigError, match="judger.name='nope'"):
        build_judger(JudgerConf(name="nope"))
